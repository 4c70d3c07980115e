"""The harness of the end-to-end training tests, as the `e2e` fixture: run `askspec run` to
its end, or start it in a process group of its own, SIGKILL the whole group when a
condition on its output folder holds (e.g. a checkpoint of some step exists), then
`--resume` the run; `run_here` / `resume_here` do a run or a resume in the test's own
process (`askspec.cli.main`), sparing a fresh interpreter's imports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, TypeVar

import pytest

T = TypeVar("T")


def askspec_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "askspec.cli", *args]


def latest_step(out: Path) -> int | None:
    """The step of the newest complete checkpoint of the one run under `out` (None: none yet)."""
    found = list(out.glob("*/checkpoints/latest.json")) if out.exists() else []
    return int(json.loads(found[0].read_text())["step"]) if found else None


def kill_run_when(cmd: list[str], out: Path, condition: Callable[[Path], T | None], timeout: float) -> T:
    """Run `cmd`; as soon as `condition(out)` returns something other than None, SIGKILL the
    run's process group and return that value. Fails the test, with the run's output, when
    the run ends (or `timeout` seconds pass) before the condition held."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            got = condition(out)
            if got is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                return got
            time.sleep(0.2)
        raise AssertionError(f"the run ended or timed out before it could be killed: "
                             f"{proc.communicate(timeout=5) if proc.poll() is not None else 'still running'}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def only_run(out: Path) -> Path:
    runs = [p for p in out.iterdir() if not p.name.startswith(".")]
    assert len(runs) == 1, runs
    return runs[0]


def run_to_end(spec: Path, out: Path, *args: str, timeout: float = 850) -> Path:
    """`askspec run SPEC --out OUT --quiet ARGS` to its end; the run's folder."""
    done = subprocess.run(askspec_cmd("run", str(spec), "--out", str(out), "--quiet", *args), capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return only_run(out)


def resume(run_dir: Path, timeout: float = 900) -> None:
    done = subprocess.run(askspec_cmd("run", "--resume", str(run_dir), "--quiet"), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr


def run_here(spec: Path, out: Path, *args: str) -> Path:
    """`run_to_end` in this process (`askspec.cli.main`): no fresh interpreter importing torch
    and transformers again (seconds a run); for a run that is not killed. The run's folder."""
    from askspec.cli import main

    assert main(["run", str(spec), "--out", str(out), "--quiet", *args]) == 0  # its stderr: pytest's captured output
    return only_run(out)


def resume_here(run_dir: Path) -> None:
    """`resume` in this process: the killed run's process is gone, this one resumes it."""
    from askspec.cli import main

    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0


@pytest.fixture(scope="session")
def e2e() -> SimpleNamespace:
    """The helpers above (a fixture rather than an import: works under any pytest import mode)."""
    return SimpleNamespace(cmd=askspec_cmd, latest_step=latest_step, kill_run_when=kill_run_when, only_run=only_run,
                           run_to_end=run_to_end, resume=resume, run_here=run_here, resume_here=resume_here)
