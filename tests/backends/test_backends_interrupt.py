"""Ctrl-C stops a real `askspec run` promptly when no call ever waits on I/O.

A replay backend has every reply at hand and a synchronous python callable used to run on
the event loop itself; either way the loop never got to the SIGINT handler, and a run
interrupted two seconds in finished all its sessions and exited 0. The backends now give
the loop a turn per call (replay) or run the callable on a worker thread (python).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

REPLAY_SPEC = """
experiment many { param n: int = 20000 }
model policy = hf("smollm2-135m-instruct")  # --replay answers for it
role a { model = policy; memory = none; prompt = "go {{ i }}" }
game g for i in range(1, n + 1) {
    x = ask a
    y = ask a
}
"""

PYTHON_SPEC = """
experiment stuck { param n: int = 4 }
model solver = python("askspec_stuck_solver:solve")
role a { model = solver; memory = none; prompt = "go {{ i }}" }
game g for i in range(1, n + 1) { x = ask a }
"""

STUCK_SOLVER = """
import os, time

def solve(messages, request):
    open(os.environ["ASKSPEC_TEST_MARK"], "w").close()
    time.sleep(30)  # a solver that hangs (bounded, so nothing outlives the test for long)
    return "late"
"""


def _finished_sessions(out: Path) -> int:
    files = list(out.glob("*/events/sessions.ndjson"))
    if not files:
        return 0
    return sum('"finished"' in line or '"ok"' in line for line in files[0].read_text().splitlines())


def _interrupt(cmd: list[str], ready, env: dict) -> tuple[int, str, float]:
    """Start `cmd`, wait for `ready()`, send SIGINT; (exit code, stderr, seconds to exit)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, f"the run ended before it could be interrupted: {proc.communicate()}"
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigint_stops_a_replay_run(tmp_path):
    n = 20000
    (tmp_path / "rec.json").write_text(json.dumps({"sessions": [{"a": ["ok", "ok"]}] * n}))
    spec = tmp_path / "many.ask"
    spec.write_text(REPLAY_SPEC)
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "askspec.cli", "run", str(spec), "--eval-only", "--replay", str(tmp_path / "rec.json"),
           "--out", str(out), "--quiet"]
    rc, err, _ = _interrupt(cmd, lambda: _finished_sessions(out) >= 10, dict(os.environ))
    assert rc == 130, err
    assert "interrupted" in err
    assert _finished_sessions(out) < n


def test_sigint_stops_a_run_stuck_in_a_sync_python_callable(tmp_path):
    (tmp_path / "askspec_stuck_solver.py").write_text(STUCK_SOLVER)
    spec = tmp_path / "stuck.ask"
    spec.write_text(PYTHON_SPEC)
    mark = tmp_path / "entered"
    env = dict(os.environ, ASKSPEC_TEST_MARK=str(mark),
               PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "askspec.cli", "run", str(spec), "--eval-only", "--out", str(tmp_path / "runs"), "--quiet"]
    rc, err, _ = _interrupt(cmd, mark.exists, env)
    assert rc == 130, err
    assert "interrupted" in err


def test_let_loop_run_yields_when_the_loop_has_not_run_for_a_while(monkeypatch):
    """Backends that never wait yield to the loop by time, not on every call: often enough
    for a cancellation scheduled on the loop (what Ctrl-C does) to land within ms."""
    import asyncio

    from askspec.runtime.backends import loop as loop_mod

    async def busy(cancelled_after: list[float]):
        task = asyncio.current_task()
        asyncio.get_running_loop().call_soon(task.cancel)  # scheduled, as the signal handler does
        t0 = time.monotonic()
        calls = 0
        try:
            while True:
                calls += 1
                await loop_mod.let_loop_run()
        except asyncio.CancelledError:
            cancelled_after.append(time.monotonic() - t0)
            cancelled_after.append(calls)

    monkeypatch.setattr(loop_mod, "_due", time.monotonic() + 0.05)  # the loop ran just now
    out: list[float] = []
    asyncio.run(busy(out))
    seconds, calls = out
    assert calls > 1  # not a yield per call
    assert seconds < 1.0  # but the cancellation landed at the next due yield
