"""How `askspec run` ends, as a user (or CI) sees it: Ctrl-C stops a run promptly even
when no model call ever waits, a run whose sessions all failed exits 3, a callable that
raises SystemExit leaves the run `failed` (not `finished`), and bad flags are refused
with one line and exit code 1 before anything runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from askspec.runtime.store import layout

pytestmark = pytest.mark.slow  # (askspec processes, a Ray cluster or a real model)

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]  # tests/: fake_models and slow_model, the specs' python models


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ASKSPEC_DEBUG"}
    env["PYTHONPATH"] = str(TESTS) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "askspec.cli", *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


def _run_dir(out: Path) -> Path:
    (run_dir,) = [d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")]
    return run_dir


def _wait_for_sessions(out: Path, n: int, proc: subprocess.Popen, limit: float = 60) -> Path:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        dirs = [d for d in out.glob("*") if d.is_dir() and not d.name.startswith(".")] if out.exists() else []
        if dirs and (dirs[0] / "events" / "sessions.ndjson").read_text().count('"finished"') >= n:
            return dirs[0]
        time.sleep(0.05)
    raise AssertionError("the run did not get going")


REPLAY_SPEC = """
model m = replay("answers.json")
role a {{ model = m; memory = none; prompt = "q {{{{ i }}}}" }}
game g for i in range(0, {n}) {{
    x = ask a
    y = ask a
}}
"""

SYNC_SPEC = """
model m = python("fake_models:blocking")
role a {{ model = m; memory = none; prompt = "q {{{{ i }}}}" }}
game g for i in range(0, {n}) {{
    x = ask a
}}
"""


@pytest.mark.parametrize("kind", ["replay", "sync_python"])
def test_ctrl_c_stops_a_run_in_which_no_call_waits(tmp_path, kind):
    """A replay backend and a synchronous python callable never give the event loop a
    turn inside a call; SIGINT must still stop the run within seconds, as `interrupted`,
    with exit code 130, and the run must resume to completion."""
    n = 200_000 if kind == "replay" else 20_000
    spec = tmp_path / "many.ask"
    spec.write_text((REPLAY_SPEC if kind == "replay" else SYNC_SPEC).format(n=n))
    if kind == "replay":
        (tmp_path / "answers.json").write_text(json.dumps({"sessions": [{"a": ["yes", "no"]}] * n}))
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "askspec.cli", "run", str(spec), "--out", str(out)],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_dir = _wait_for_sessions(out, 20, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # all n sessions would take minutes
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    manifest = layout.read_manifest(run_dir)
    assert manifest["status"] == "interrupted"
    listed = _cli("runs", str(out))
    assert "interrupted" in listed.stdout
    done = (run_dir / "events" / "sessions.ndjson").read_text().count('"finished"')
    assert done < n


def test_resume_after_ctrl_c_finishes_the_run(tmp_path):
    n = 1000  # ~3 s of 3 ms calls: Ctrl-C lands after the 10th session, long before the last
    spec = tmp_path / "many.ask"
    spec.write_text(SYNC_SPEC.format(n=n))
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "askspec.cli", "run", str(spec), "--out", str(out), "--quiet"],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_dir = _wait_for_sessions(out, 10, proc)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    resumed = _cli("run", "--resume", str(run_dir), "--quiet", timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    from askspec.runtime.store.views import open_store

    con = open_store(str(run_dir))
    assert con.execute("select count(*), count(distinct session_id) from sessions where status = 'ok'").fetchone() == (
        n, n)
    assert layout.read_manifest(run_dir)["status"] == "finished"


@pytest.mark.parametrize("callable_name, status, code", [
    ("fake_models:exits", "failed", 1),
    ("fake_models:generator_exit", "failed", 1),
    ("fake_models:interrupts", "interrupted", 130),
])
def test_a_callable_raising_a_base_exception_does_not_leave_the_run_finished(tmp_path, callable_name, status, code):
    spec = tmp_path / "exits.ask"
    spec.write_text(f'model m = python("{callable_name}")\n'
                    'role a { model = m; memory = none; prompt = "q {{ i }}" }\n'
                    "game g for i in range(0, 6) {\n    x = ask a\n}\n")
    out = tmp_path / "runs"
    res = _cli("run", str(spec), "--out", str(out), "--concurrency", "1")
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr
    run_dir = _run_dir(out)
    assert layout.read_manifest(run_dir)["status"] == status
    listed = _cli("runs", str(out))
    assert f" {status} " in listed.stdout
    if status == "failed":
        assert "the run failed" in res.stderr and ("SystemExit" in res.stderr or "GeneratorExit" in res.stderr)


def test_no_session_succeeded_exits_3(tmp_path):
    spec = tmp_path / "down.ask"
    spec.write_text('model m = python("fake_models:fails")\n'
                    'role a { model = m; memory = none; prompt = "q" }\n'
                    "game g for i in range(0, 3) {\n    x = ask a\n}\n")
    res = _cli("run", str(spec), "--out", str(tmp_path / "runs"), "--quiet")
    assert res.returncode == 3, res.stderr
    assert "no session succeeded" in res.stderr and "fake model is down" in res.stderr
    assert layout.read_manifest(_run_dir(tmp_path / "runs"))["status"] == "finished"


@pytest.mark.parametrize("flags, message", [
    (["--sessions", "-1"], "--sessions must be at least 1, got -1"),
    (["--sessions", "0"], "--sessions must be at least 1, got 0"),
    (["--concurrency", "0"], "--concurrency must be at least 1, got 0"),
    (["--max-tokens", "0"], "--max-tokens must be at least 1, got 0"),
    (["--seed", "-5"], "--seed must be at least 0, got -5"),
    (["--sessions", "many"], "argument --sessions: invalid int value: 'many'"),
    (["--backend", "hff"], "did you mean 'hf'?"),
    (["--set", "probes"], "--set takes NAME=VALUE"),
    (["--model", "questionr=hf:x"], "no role named 'questionr' (did you mean 'questioner'?)"),
    (["--replay", "x.json", "--backend", "hf"], "cannot be combined with --backend hf"),
])
def test_bad_flags_are_refused_before_anything_runs(tmp_path, flags, message):
    out = tmp_path / "runs"
    res = _cli("run", "specs/ask_e.ask", "--out", str(out), *flags)
    assert res.returncode == 1, res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()
