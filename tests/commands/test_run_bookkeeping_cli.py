"""`askspec run` bookkeeping at the command line (issues 30 item 5, 33): `--resume` of a
finished run says so and loads nothing; a new run's manifest is written once, complete,
so a kill at any manifest write of the start-up never leaves a run that resumes as
another kind of run (a training run as an evaluation)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.runtime.store import faults, layout

pytestmark = pytest.mark.slow  # (askspec processes, a Ray cluster or a real model)

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


def _cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("ASKSPEC_DEBUG", faults.ENV)}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), base.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "askspec.cli", *args], cwd=ROOT, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def _runs(out: Path) -> list[Path]:
    return [d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")] if out.exists() else []


def test_resume_of_a_finished_run_says_so_and_loads_no_model(tmp_path):
    module = tmp_path / "mods" / "gone_model.py"
    module.parent.mkdir()
    module.write_text("def reply(messages, request):\n    return 'fine'\n")
    spec = tmp_path / "done.ask"
    spec.write_text('model m = python("gone_model:reply")\nrole a { model = m; memory = none; prompt = "q {{ i }}" }\n'
                    "game g for i in range(0, 2) {\n    x = ask a\n}\n")
    env = {"PYTHONPATH": f"{module.parent}{os.pathsep}{TESTS}"}
    done = _cli("run", str(spec), "--out", str(tmp_path / "runs"), "--quiet", env=env)
    assert done.returncode == 0, done.stderr
    (run,) = _runs(tmp_path / "runs")
    before = layout.manifest_path(run).read_bytes()
    module.unlink()  # loading the model again would fail
    again = _cli("run", "--resume", str(run), env=env)
    assert again.returncode == 0, again.stderr
    assert f"run {run.name} finished at " in again.stderr and "nothing to resume" in again.stderr
    assert "error" not in again.stderr and "Traceback" not in again.stderr
    assert again.stdout.strip() == str(run)
    assert layout.manifest_path(run).read_bytes() == before  # nothing changed


TRAIN_SPEC = """model m = hf("{model}") {{ max_tokens = 3; temperature = 1.0 }}
role a {{ model = m; memory = none; prompt = "a + b"; trained }}
game g for i in range(0, 4) {{
    x = ask a
    reward a = len(x.text)
}}
train a with grpo {{ group = 2; steps = 2; save_every = 1; lr = 0.01 }}
"""


def test_a_kill_at_every_manifest_write_of_the_start_never_resumes_as_an_evaluation(tiny_model, tmp_path):
    spec = tmp_path / "t.ask"
    spec.write_text(TRAIN_SPEC.format(model=tiny_model))
    for n in range(1, 8):
        out = tmp_path / f"kill-{n}"
        killed = _cli("run", str(spec), "--out", str(out), "--quiet", env={faults.ENV: str(n)})
        if killed.returncode == 0:  # the run wrote its manifest fewer than n times: every point was tried
            assert n >= 3, f"a run writes its manifest at least twice (created, finished); {n - 1} kill(s) tried"
            return
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        runs = _runs(out)
        if not runs:  # killed before the run directory appeared: no run to resume
            assert n == 1
            continue
        (run,) = runs
        manifest = layout.read_manifest(run)
        # complete from the first write on: what a resume needs to tell the kind of run
        assert manifest["training"]["steps"] == 2 and manifest["run_options"] is not None
        assert manifest["spec_path"] == str(spec) and manifest["determinism"]
        # resumed in this process (askspec.cli.main): only the killed run needs a process of its own
        assert main(["run", "--resume", str(run), "--quiet"]) == 0, n
        assert layout.read_manifest(run)["status"] == "finished"
        steps = [json.loads(line)["step"] for line in (run / "events" / "train_steps.ndjson").read_text().splitlines()]
        assert sorted(set(steps)) == [1, 2], (n, steps)  # it trained: not one evaluation pass
        assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 2
    raise AssertionError("the run was still killed at its 7th manifest write")


def test_a_training_run_without_its_training_record_is_refused_not_evaluated(tmp_path, capsys):
    """A manifest an older askspec left when killed between its writes (the spec named, the
    training record not yet written) would have resumed as an evaluation: one pass, no
    training, status finished. It is refused, before any model loads."""
    import asyncio

    from askspec.runtime.commands.options import RunOptions
    from askspec.runtime.commands.run import run_spec
    from askspec.runtime.commands.start import compile_spec
    from askspec.runtime.store.writer import RunWriter

    spec = tmp_path / "t.ask"
    spec.write_text(TRAIN_SPEC.format(model="no-such-model-is-loaded"))
    _, ehash = compile_spec(RunOptions(file=str(spec)), None)
    w = RunWriter.create(tmp_path / "runs", experiment="t", experiment_hash=ehash, ir_json="{}", spec_files={},
                         seed=0, roles={}, params={}, planned_sessions=4, argv=["askspec", "run", str(spec)])
    w.annotate(spec_path=str(spec))
    w.close()  # killed: status running, no training record
    rc, _ = asyncio.run(run_spec(resume=str(w.run_dir)))
    assert rc == 1
    err = capsys.readouterr().err
    assert f"cannot resume {w.run_dir}: the spec trains, but the run's manifest has no record of its training" in err
    manifest = layout.read_manifest(w.run_dir)
    assert manifest["status"] == "running" and manifest["resumes"] == 0  # nothing ran
    assert not (w.run_dir / "events" / "sessions.ndjson").read_text()
