"""OpenRLHF 0.11.2's own code, reached on CPU, for the tests of the OpenRLHF target.

`openrlhf/cli/train_ppo_ray.py` and `openrlhf/trainer/ray/vllm_engine.py` import ray,
vLLM and DeepSpeed at module top, so the pieces the tests need — the argument parser and
its validation (the `if __name__ == "__main__":` block), the agent loader
`_load_agent_executor`, and `RolloutRayActor.generate_responses` (which runs the N samples
of a prompt on one executor) — are extracted from the installed source with `ast` and run
alone; `openrlhf/models/loss.py` (PolicyLoss) is loaded as it is, beside stand-ins for its
package and utils, which import DeepSpeed. Everything else here is a test double, named
Fake*: a vLLM `SamplingParams` stand-in and an `llm_engine` that returns scripted token ids.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import datetime
import importlib.metadata
import importlib.util
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Callable, Optional

import openrlhf
from openrlhf.utils.agent import AgentExecutorBase

OPENRLHF = Path(openrlhf.__file__).parent
VERSION = importlib.metadata.version("openrlhf")
assert VERSION == "0.11.2", f"the OpenRLHF target is for openrlhf 0.11.2, found {VERSION} (scripts/setup.sh)"


def _source(rel: str) -> ast.Module:
    return ast.parse((OPENRLHF / rel).read_text(encoding="utf-8"))


def parse_train_ppo_ray(argv: list[str]):
    """Parse `argv` with train_ppo_ray's own parser and run its own validation (every
    statement of its main block except `train(args)`); returns the hierarchical args."""
    return _parse_cli("cli/train_ppo_ray.py", argv)


def parse_train_sft(argv: list[str]):
    """The same for openrlhf.cli.train_sft (the `sft` stages' trainer)."""
    return _parse_cli("cli/train_sft.py", argv)


def _parse_cli(rel: str, argv: list[str]):
    tree = _source(rel)
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    body = [s for s in main.body if not (isinstance(s, ast.Expr) and ast.unparse(s) == "train(args)")]
    module = ast.Module(body=body, type_ignores=[])
    # `parser.parse_args()` reads sys.argv: hand it ours
    code = ast.unparse(module).replace("parser.parse_args()", "parser.parse_args(ARGV)")
    scope = {"argparse": argparse, "datetime": datetime.datetime, "os": os, "ARGV": list(argv)}
    exec(compile(code, str(OPENRLHF / rel), "exec"), scope)
    return scope["args"]


def _function(rel: str, name: str, cls: str | None = None) -> Callable:
    tree = _source(rel)
    nodes = tree.body
    if cls is not None:
        nodes = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)
    scope = {"AgentExecutorBase": AgentExecutorBase, "asyncio": asyncio, "importlib": importlib}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(OPENRLHF / rel), "exec"), scope)
    return scope[name]


def load_policy_loss(register: Callable[[str, ModuleType], None]) -> ModuleType:
    """OpenRLHF's own `openrlhf/models/loss.py` as `openrlhf.models.loss`, on CPU, beside
    stand-ins for its package and utils (`stub_openrlhf_models`)."""
    package = stub_openrlhf_models(register)
    spec = importlib.util.spec_from_file_location("openrlhf.models.loss", OPENRLHF / "models/loss.py")
    assert spec is not None and spec.loader is not None
    loss = importlib.util.module_from_spec(spec)
    register("openrlhf.models.loss", loss)
    spec.loader.exec_module(loss)
    package.loss = loss  # type: ignore[attr-defined]
    return loss


def stub_openrlhf_models(register: Callable[[str, ModuleType], None]) -> ModuleType:
    """Make `import openrlhf.models.loss` (OpenRLHF's own file) work on CPU: the real
    `openrlhf.models` package imports peft and DeepSpeed and `openrlhf.models.utils` imports
    DeepSpeed at module top, so they are registered (through `register(name, module)`, e.g.
    monkeypatch.setitem on sys.modules) as a bare package over the real folder and a module
    holding OpenRLHF's own `masked_mean`, extracted from utils.py. Returns the package."""
    package = ModuleType("openrlhf.models")
    package.__path__ = [str(OPENRLHF / "models")]
    register("openrlhf.models", package)
    utils = ModuleType("openrlhf.models.utils")
    tree = _source("models/utils.py")
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "masked_mean")
    utils.__dict__.update({"torch": importlib.import_module("torch"), "Optional": Optional})
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(OPENRLHF / "models/utils.py"), "exec"), utils.__dict__)
    register("openrlhf.models.utils", utils)
    return package


def load_agent_executor(path: str | Path) -> AgentExecutorBase:
    """OpenRLHF's own `_load_agent_executor` (vllm_engine.py) on the generated agent.py."""
    return _function("trainer/ray/vllm_engine.py", "_load_agent_executor")(str(path))


GENERATE_RESPONSES = None


async def generate_responses(engine: "FakeEngine", prompt: str, label: str, sampling_params, max_length: int,
                             tokenizer, num_samples: int):
    """`RolloutRayActor.generate_responses` (OpenRLHF's code) with `engine` as the actor."""
    global GENERATE_RESPONSES
    if GENERATE_RESPONSES is None:
        GENERATE_RESPONSES = _function("trainer/ray/vllm_engine.py", "generate_responses", cls="RolloutRayActor")
    return await GENERATE_RESPONSES(engine, prompt=prompt, label=label, sampling_params=sampling_params,
                                    max_length=max_length, hf_tokenizer=tokenizer, num_samples=num_samples)


@dataclass
class FakeSamplingParams:
    """The fields of vLLM's SamplingParams that OpenRLHF's rollout sets (a test double)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = None
    min_tokens: int = 1
    skip_special_tokens: bool = False
    logprobs: int | None = None
    stop: list[str] = field(default_factory=list)


class FakeEngine:
    """A scripted `llm_engine` (test double): `script(prompt_text)` picks the reply text for a
    generate call; the reply is returned as token ids ending with <|im_end|>, as vLLM does."""

    def __init__(self, executor, tokenizer, script: Callable[[str], str], end_id: int = 2) -> None:
        self.executor = executor  # generate_responses calls self.executor.execute
        self.tokenizer = tokenizer
        self.script = script
        self.end_id = end_id
        self.calls: list[dict] = []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        prompt = self.tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        text = self.script(prompt)
        ids = self.tokenizer(text=text, add_special_tokens=False)["input_ids"]
        finish = "stop"
        if sampling_params.max_tokens is not None and len(ids) + 1 > sampling_params.max_tokens:
            ids, finish = ids[: sampling_params.max_tokens], "length"
        else:
            ids = ids + [self.end_id]
        logprobs = None
        if sampling_params.logprobs is not None:
            logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in ids]
        self.calls.append({"prompt_ids": list(prompt_token_ids), "ids": ids, "text": text})
        out = SimpleNamespace(token_ids=ids, text=self.tokenizer.decode(ids), finish_reason=finish, logprobs=logprobs)
        return SimpleNamespace(outputs=[out])


def smollm2_tokenizer():
    """The tokenizer of the packaged SmolLM2 weights (converted once, cached)."""
    from transformers import AutoTokenizer

    from askspec.runtime.backends.hf import resolve_weights

    return AutoTokenizer.from_pretrained(str(resolve_weights("smollm2-135m-instruct")))


def launch_argv(script: Path, tmp: Path, env: dict | None = None, fail: str | None = None) -> list[list[str]]:
    """Run a generated shell script with `ray`, `deepspeed`, `vllm`, `curl` and `askspec`
    stubbed on PATH; returns each stub call's argv (first element: the program). A `ray
    job submit` or `deepspeed` stub writes a `config.json` into `--ckpt.output_dir`, as a
    finished job leaves its HF checkpoint. The program named by `fail` exits 1 (after
    logging its call), as a failed job does; the script's own failure is then expected."""
    bindir = tmp / "stubs"
    bindir.mkdir(exist_ok=True)
    log = tmp / "calls.log"
    log.unlink(missing_ok=True)
    for marker in tmp.glob("calls.log.up.*"):
        marker.unlink()
    stub = ('#!/usr/bin/env bash\n'
            # a backgrounded vllm stub logs while ray runs: one lock around each record, or two
            # records interleave and merge (a call goes missing from the parsed log); the
            # argument count keeps empty arguments and ones holding newlines intact
            '{ flock 9; printf "%s\\0" "$(basename "$0")" "$#" "$@" >> "$STUB_LOG"; } 9>>"$STUB_LOG.lock"\n'
            'if [ "$(basename "$0")" = ray ] || [ "$(basename "$0")" = deepspeed ]; then\n'
            '  prev=""; for a in "$@"; do if [ "$prev" = --ckpt.output_dir ]; then mkdir -p "$a"; '
            'echo "{}" > "$a/config.json"; fi; prev="$a"; done\n'
            'fi\n'
            # the readiness probe (curl) answers once the vllm stub of its port has logged its
            # call, as a real server answers once it is up: `serve_frozen.sh stop` cannot kill a
            # stub that has not logged yet (each start leaves one marker, each probe takes it)
            'if [ "$(basename "$0")" = vllm ]; then\n'
            '  prev=""; for a in "$@"; do if [ "$prev" = --port ]; then touch "$STUB_LOG.up.$a"; fi; prev="$a"; done\n'
            '  sleep 0.1\n'
            'fi\n'
            'if [ "$(basename "$0")" = curl ] && [[ "${@: -1}" =~ :([0-9]+)/ ]]; then\n'
            '  for _ in $(seq 200); do rm "$STUB_LOG.up.${BASH_REMATCH[1]}" 2>/dev/null && exit 0; sleep 0.05; done\n'
            '  exit 1\n'
            'fi\n')
    for name in ("ray", "deepspeed", "vllm", "curl", "askspec"):
        (bindir / name).write_text(stub + ('exit 1\n' if name == fail else ''))
        (bindir / name).chmod(0o755)
    run_env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "STUB_LOG": str(log), **(env or {})}
    done = subprocess.run(["bash", str(script)], env=run_env, cwd=tmp, timeout=60, stdout=subprocess.DEVNULL)
    assert (done.returncode != 0) == (fail is not None), f"{script} exited {done.returncode}"
    calls = []
    parts = (log.read_bytes() if log.exists() else b"").split(b"\0")[:-1]  # each field ends with a NUL
    while parts:
        n = int(parts[1])
        calls.append([p.decode() for p in [parts[0], *parts[2:2 + n]]])
        parts = parts[2 + n:]
    return calls


# OpenRLHF's entry point, askspec's wrapper of it that installs the CISPO loss first, and the
# nested schedule's (the job's askspec_nested.py: OpenRLHF's, with the inner-loop service)
ENTRY_POINTS = ("openrlhf.cli.train_ppo_ray", "askspec_ext.train_ppo_ray", "askspec_nested")


def sft_flags(call: list[str]) -> list[str]:
    """The train_sft arguments of a `deepspeed ... --module openrlhf.cli.train_sft ...` call."""
    i = call.index("--module")
    assert call[i + 1] == "openrlhf.cli.train_sft", call
    return call[i + 2:]


def train_flags(call: list[str]) -> list[str]:
    """The train_ppo_ray arguments of a `ray job submit ... -- python3 -m ...` call."""
    i = call.index("--")
    assert call[i + 1: i + 3] == ["python3", "-m"] and call[i + 3] in ENTRY_POINTS, call
    return call[i + 4:]


class InProcessService:
    """The agent's inner-loop service (a Ray actor in a job, inner_loop.connect) as a test
    double around a real `InnerLoopHost` in this process: `answer` runs in a worker thread
    (the host runs its own event loop), and every call is kept in `calls`."""

    def __init__(self, host) -> None:
        self.host = host
        self.calls: list[dict] = []

    async def answer(self, key: str, datasets: list[list[dict]]) -> dict:
        self.calls.append({"key": key, "datasets": datasets})
        return await asyncio.to_thread(self.host.answer, key, datasets)


def boxed_three(messages, request) -> str:
    """A python model (test double) for `askspec run --model ROLE=python:openrlhf_harness:boxed_three`."""
    return "\\boxed{3}"


def assert_pin_refusals(hook: ModuleType, changed_source: str, monkeypatch) -> None:
    """An askspec_ext hook pinned through askspec_ext/pinned.py (`hook.install`,
    `hook.sources`, `hook.pinned`) refuses to install under another OpenRLHF version, and
    under 0.11.2 when the code it hooks (`changed_source` stands in for it) differs from the
    release's. The caller checks that nothing was hooked."""
    import pytest

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.12.0" if name == "openrlhf" else real(name))
    with pytest.raises(hook.pinned.VersionMismatch, match=r"written for OpenRLHF 0\.11\.2.*openrlhf 0\.12\.0"):
        hook.install()
    monkeypatch.setattr(importlib.metadata, "version", real)
    monkeypatch.setattr(hook, "sources", lambda: [changed_source])
    with pytest.raises(hook.pinned.VersionMismatch, match=r"differs from the released 0\.11\.2's"):
        hook.install()
