"""A run killed with SIGKILL mid-way resumes without losing or duplicating sessions, and
the lines written before the kill stay byte-identical."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (askspec processes, a Ray cluster or a real model)

ROOT = Path(__file__).resolve().parents[2]

SPEC = """
experiment resume_demo {
    param n: int = 40
    seed = 7
}
model slow = python("slow_model:reply")
role asker { model = slow; memory = none; reply = sections("#Question#"); prompt = "Ask question {{ i }}." }
role solver { model = slow; memory = none; reply = boxed }
game one for i in range(1, n + 1) {
    outcomes solved, unsolved
    q = ask asker
    s = ask solver: q.question
    outcome = case { s.answer == str(i + 0) -> solved; else -> unsolved }
    fresh = novelty(str(i % 3) + " " + str(i % 4), history = 4, tau_sim = 0.3)
}
"""


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_sigkill_then_resume(tmp_path):
    spec = tmp_path / "resume_demo.ask"
    spec.write_text(SPEC)
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "askspec.cli", "run", str(spec), "--eval-only", "--out", str(out), "--concurrency", "2", "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run_dir = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        dirs = [d for d in out.glob("*") if d.is_dir() and not d.name.startswith(".")] if out.exists() else []
        if dirs:
            run_dir = dirs[0]
            sessions = run_dir / "events" / "sessions.ndjson"
            finished = [l for l in sessions.read_text().splitlines() if '"finished"' in l or '"ok"' in l]
            if len(finished) >= 6:
                break
        time.sleep(0.05)
    assert run_dir is not None, proc.stderr.read().decode() if proc.poll() is not None else "no run dir"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    from askspec.runtime.store.views import open_store

    con = open_store(str(run_dir))
    before_ok = {r[0] for r in con.execute("select session_id from sessions where status = 'ok'").fetchall()}
    assert 0 < len(before_ok) < 40
    turns_before = _lines(run_dir / "events" / "turns.ndjson")
    sessions_before = _lines(run_dir / "events" / "sessions.ndjson")
    # the killed run is shown as crashed (its manifest still says running; its pid is gone)
    from askspec.runtime.commands.runs import list_runs

    (listed,) = list_runs(run_dir)
    assert listed["status"] == "crashed" and listed["turns"] == len([l for l in turns_before if l.endswith(b"\n")])

    resumed = subprocess.run([sys.executable, "-m", "askspec.cli", "run", "--resume", str(run_dir), "--quiet"],
                             cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr

    con = open_store(str(run_dir))
    rows = con.execute("select session_id, status, count(*) over (partition by session_id) from sessions").fetchall()
    ids = sorted(r[0] for r in rows)
    assert ids == [f"s{k:06d}" for k in range(40)]  # every planned session exactly once
    assert all(r[1] == "ok" and r[2] == 1 for r in rows)
    # every finished session has exactly its two turns, no duplicates from the killed attempt
    per = dict(con.execute("select session_id, count(*) from turns group by session_id").fetchall())
    assert set(per.values()) == {2}
    # lines written before the kill are untouched (complete lines are byte-identical)
    turns_after = _lines(run_dir / "events" / "turns.ndjson")
    complete_before = [l for l in turns_before if l.endswith(b"\n")]
    assert turns_after[: len(complete_before)] == complete_before
    sessions_after = _lines(run_dir / "events" / "sessions.ndjson")
    complete_s = [l for l in sessions_before if l.endswith(b"\n")]
    assert sessions_after[: len(complete_s)] == complete_s
    # the sessions that had finished before the kill were not run again
    reran = con.execute("select session_id from sessions where attempt > 1").fetchall()
    assert not (before_ok & {r[0] for r in reran})
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    # the totals and the duration are the two processes', not the resuming one's (issue 30)
    (all_turns,) = con.execute("select count(*) from events_turns").fetchone()
    killed, resuming = manifest["history"]
    assert manifest["totals"]["turns"] == all_turns == killed["totals"]["turns"] + resuming["totals"]["turns"]
    assert killed["killed"] and killed["totals"]["turns"] >= 12  # its 6 finished sessions' turns at least
    from askspec.runtime.store.liveness import process_seconds

    assert process_seconds(killed) >= 0.5  # 6 sessions of two 0.15 s turns, two at a time
    assert manifest["duration_s"] == pytest.approx(process_seconds(killed) + process_seconds(resuming), abs=0.01)
    # run-level histories (novelty) were rebuilt: the resumed run equals an uninterrupted one
    clean = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(spec), "--eval-only", "--out", str(tmp_path / "clean"),
                            "--quiet"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    clean_con = open_store(clean.stdout.strip().splitlines()[-1])
    query = "select session_id, json_extract(vars, '$.fresh') from sessions order by 1"
    assert con.execute(query).fetchall() == clean_con.execute(query).fetchall()


def test_resume_refuses_changed_spec(tmp_path):
    spec = tmp_path / "resume_demo.ask"
    spec.write_text(SPEC.replace("param n: int = 40", "param n: int = 3"))
    out = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(spec), "--eval-only", "--out", str(out), "--quiet"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    manifest = json.loads((run_dir / "manifest.json").read_text())  # as if interrupted (a finished run has
    manifest["status"] = "interrupted"  # nothing to resume: --resume says so whatever the spec)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    spec.write_text(spec.read_text().replace("Ask question", "Please ask question"))
    again = subprocess.run([sys.executable, "-m", "askspec.cli", "run", "--resume", str(run_dir)],
                           cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 1
    assert "refusing to resume" in again.stderr and "hash" in again.stderr
    assert "Traceback" not in again.stderr


def test_ctrl_c_stops_cleanly_and_resumes(tmp_path):
    spec = tmp_path / "resume_demo.ask"
    spec.write_text(SPEC)
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "askspec.cli", "run", str(spec), "--eval-only", "--out", str(out), "--concurrency", "2"],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    run_dir = None
    while time.monotonic() < deadline:
        dirs = [d for d in out.glob("*") if d.is_dir() and not d.name.startswith(".")] if out.exists() else []
        if dirs and '"ok"' in (dirs[0] / "events" / "sessions.ndjson").read_text():
            run_dir = dirs[0]
            break
        time.sleep(0.05)
    assert run_dir is not None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "--resume" in err
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    resumed = subprocess.run([sys.executable, "-m", "askspec.cli", "run", "--resume", str(run_dir), "--quiet"],
                             cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    from askspec.runtime.store.views import open_store

    con = open_store(str(run_dir))
    assert con.execute("select count(distinct session_id), count(*) from sessions where status='ok'").fetchone() == (40, 40)
