"""Damaged run directories (issue #8 item 7): a clear error naming the file (and line), or
a resume that moves the damaged lines to events/quarantine.ndjson and loses nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.runtime.store import layout
from askspec.runtime.store.check import line_problem, scan_file
from askspec.runtime.store.views import DamagedRunWarning, StoreError, connect
from askspec.runtime.store.writer import RunWriter

ROOT = Path(__file__).resolve().parents[2]


def quarantine(run_dir):
    path = run_dir / "events" / "quarantine.ndjson"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("text, message", [
    ('{"run_id": "x", ', r"manifest\.json:1:\d+: not valid JSON"),
    ("[1, 2]", r"manifest\.json: expected a JSON object, found a list"),
    (None, r"manifest\.json: field 'seed' must be an integer, not a string \"seven\""),
    ("resumes", r"field 'resumes' must be an integer, not a string \"2\""),
    ("status", r"field 'status' must be one of running, finished, failed, interrupted, not \"done\""),
    ("history", r"history\[0\] must be an object, not an integer"),
    ("options", r"run_options\.sessions must be an integer or null, not a string"),
])
def test_bad_manifest_is_one_clear_error(kit, tmp_path, text, message):
    w = kit.new_writer(tmp_path)
    kit.play_session(w, 0)
    w.finish()
    m = json.loads(layout.manifest_path(w.run_dir).read_text())
    if text is None:
        m["seed"] = "seven"
    elif text == "resumes":
        m["resumes"] = "2"
    elif text == "status":
        m["status"] = "done"
    elif text == "history":
        m["history"] = [3]
    elif text == "options":
        m["run_options"] = {"sessions": "all"}
    raw = text if text not in (None, "resumes", "status", "history", "options") else json.dumps(m)
    layout.manifest_path(w.run_dir).write_text(raw)
    with pytest.raises(layout.ManifestError, match=message):
        RunWriter.open_for_resume(w.run_dir)
    with pytest.raises(StoreError, match="cannot read run: .*" + message):
        connect(w.run_dir)
    # In a folder of runs the damaged one is skipped with a warning; the others stay readable.
    ok = kit.new_writer(tmp_path, experiment="fine")
    ok.finish()
    store = connect(tmp_path)
    assert [c for c, _ in store.warnings] == [DamagedRunWarning]
    assert store.con.execute("SELECT experiment FROM runs").fetchall() == [("fine",)]


def damaged_run(kit, tmp_path):
    """s0 and s1 finished, s2 half-way; then damage: a mistyped reward, a non-JSON line and
    a line missing its session in the middle of files, and a torn last line."""
    w = kit.new_writer(tmp_path, flush_interval=0)
    for i in range(2):
        kit.play_session(w, i)
    kit.play_session(w, 2, finish=False)
    w.close()  # dies
    rewards = layout.ndjson_path(w.run_dir, "rewards")
    lines = rewards.read_bytes().splitlines(keepends=True)
    bad = json.loads(lines[1])
    bad["value"] = "high"
    lines[1] = (json.dumps(bad) + "\n").encode()
    lines.insert(3, b"this is not json\n")
    rewards.write_bytes(b"".join(lines))
    turns = layout.ndjson_path(w.run_dir, "turns")
    with open(turns, "ab") as f:
        f.write(b'{"seq": 100, "ts": "2026-01-01T00:00:00Z", "run_id": "r", "gen": 0, "attempt": 1}\n')
        f.write(b'{"seq":101,"ts":"2026-01-01T00:00:00.000000Z","run_id":"r","gen":0,"session_id":"s2","at')
    return w.run_dir


def test_check_names_every_damaged_line(kit, tmp_path):
    run_dir = damaged_run(kit, tmp_path)
    bad = scan_file(layout.ndjson_path(run_dir, "rewards"), "rewards")
    assert [(b.line, b.reason) for b in bad] == [
        (2, "'value' must be a number, not a string \"high\""),
        (4, "not JSON (Expecting value)")]
    assert [(b.line, b.torn) for b in scan_file(layout.ndjson_path(run_dir, "turns"), "turns")] == [
        (7, False), (8, True)]
    assert line_problem("sessions", b'{"seq":1,"ts":"2026-01-01T00:00:00Z","run_id":"r","gen":0,'
                                    b'"event":"paused","session_id":"s","attempt":1}') == \
        "'event' must be started or finished, not \"paused\""
    assert line_problem("turns", b"[1]") == "not a JSON object (a list)"
    assert line_problem("sessions", b'{"seq":1,"ts":"2026-01-01T00:00:00Z","run_id":"r","gen":0,"event":"finished",'
                                    b'"session_id":"s","attempt":1,"vars":[1]}') == \
        "'vars' must be a JSON object, not a list [1]"
    assert line_problem("rewards", b'{"seq":1,"ts":"2026-01-01T00:00:00Z","run_id":"r","gen":0,"session_id":"s",'
                                   b'"attempt":1,"role":"q","name":"n","kind":"turn","value":NaN}') is None
    assert line_problem("rewards", b'{"seq": 1, "ts": 5}') == "'run_id' is missing"


def test_queries_skip_damaged_lines(kit, tmp_path):
    run_dir = damaged_run(kit, tmp_path)
    con = connect(run_dir).con
    # No error; the unparseable and incomplete lines are not rows.
    assert con.execute("SELECT count(*) FROM events_turns").fetchone() == (6,)
    assert con.execute("SELECT count(*) FROM events_rewards").fetchone() == (8,)
    assert con.execute("SELECT count(*) FROM rewards WHERE value IS NULL").fetchone() == (1,)


def test_resume_quarantines_damaged_lines_and_loses_nothing(kit, tmp_path):
    run_dir = damaged_run(kit, tmp_path)
    originals = {n: layout.ndjson_path(run_dir, n).read_bytes() for n in layout.EVENT_NAMES}
    w = RunWriter.open_for_resume(run_dir, flush_interval=0)
    assert w.notes == [
        "events/turns.ndjson: moved 2 damaged line(s) to events/quarantine.ndjson (line 7: 'session_id' is "
        "missing; line 8: partial last line (interrupted write): not JSON (Unterminated string starting at))",
        "events/rewards.ndjson: moved 2 damaged line(s) to events/quarantine.ndjson (line 2: 'value' must be "
        "a number, not a string \"high\"; line 4: not JSON (Expecting value))"]
    assert w.completed_sessions() == {"s0", "s1"}
    q = quarantine(run_dir)
    assert [(r["file"], r["line"]) for r in q] == [
        ("turns.ndjson", 7), ("turns.ndjson", 8), ("rewards.ndjson", 2), ("rewards.ndjson", 4)]
    # Nothing lost: each original file is exactly its clean lines plus the quarantined ones.
    for name in ("turns", "rewards"):
        now = layout.ndjson_path(run_dir, name).read_bytes()
        kept = now.splitlines(keepends=True)
        moved = {r["offset"]: r["raw"].encode() for r in q if r["file"] == f"{name}.ndjson"}
        rebuilt, offset = [], 0
        for line in originals[name].splitlines(keepends=True):
            if offset in moved:
                assert line.rstrip(b"\n") == moved[offset]
            else:
                rebuilt.append(line if line.endswith(b"\n") else line + b"\n")
            offset += len(line)
        assert kept == rebuilt
        assert all(isinstance(json.loads(line), dict) for line in kept)
    kit.play_session(w, 2)
    w.finish()
    store = connect(run_dir)
    assert [c for c, _ in store.warnings] == [DamagedRunWarning]
    assert "4 damaged line(s) of rewards.ndjson, turns.ndjson were moved" in store.warnings[0][1]
    con = store.con
    assert con.execute("SELECT count(*) FROM rewards WHERE value IS NULL").fetchone() == (0,)
    assert con.execute("SELECT list(DISTINCT status) FROM sessions").fetchone() == (["ok"],)
    # Resuming again scans nothing new and moves nothing.
    RunWriter.open_for_resume(run_dir).finish()
    assert len(quarantine(run_dir)) == 4


def test_a_complete_last_line_without_newline_is_kept(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)
    kit.play_session(w, 0)
    w.close()
    path = layout.ndjson_path(w.run_dir, "sessions")
    path.write_bytes(path.read_bytes()[:-1])  # the write stopped right before the newline
    w = RunWriter.open_for_resume(w.run_dir)
    assert w.notes == [] and w.completed_sessions() == {"s0"}
    w.finish()
    assert path.read_bytes().endswith(b"}\n") and quarantine(w.run_dir) == []


def test_finished_files_are_not_scanned_again_unless_changed(kit, tmp_path, monkeypatch):
    import askspec.runtime.store.recover as recover

    w = kit.new_writer(tmp_path)
    kit.play_session(w, 0)
    w.finish()
    scanned = []
    real = recover.check.scan_file
    monkeypatch.setattr(recover.check, "scan_file", lambda p, n: scanned.append(n) or real(p, n))
    RunWriter.open_for_resume(w.run_dir).finish()
    assert scanned == []
    with open(layout.ndjson_path(w.run_dir, "rewards"), "ab") as f:
        f.write(b'{"seq": 99}\n')  # edited after the writer closed it
    w = RunWriter.open_for_resume(w.run_dir)
    assert scanned == ["rewards"] and len(w.notes) == 1
    w.finish()


SPEC = """
experiment damaged { param n: int = 3  seed = 3 }
model m = python("damaged_model:reply")
role player { model = m; memory = none; reply = sections("#Answer#"); prompt = "Turn {{ t }}." }
game play for i in range(0, n) {
    repeat t in 1..2 { r = ask player }
    score = 1
}
"""


def test_cli_resume_of_damaged_runs(tmp_path):
    (tmp_path / "damaged_model.py").write_text("def reply(messages, request):\n    return '#Answer# ok'\n")
    spec = tmp_path / "damaged.ask"
    spec.write_text(SPEC)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "askspec.cli", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)

    def interrupted(run_dir: Path) -> None:  # (a finished run has nothing to resume: --resume says so)
        manifest = json.loads(layout.manifest_path(run_dir).read_text())
        manifest["status"] = "interrupted"
        layout.manifest_path(run_dir).write_text(json.dumps(manifest))

    done = cli("run", str(spec), "--out", str(tmp_path / "runs"), "--quiet")
    assert done.returncode == 0, done.stderr
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    interrupted(run_dir)
    sessions = layout.ndjson_path(run_dir, "sessions")
    lines = sessions.read_bytes().splitlines(keepends=True)
    sessions.write_bytes(lines[0] + b"\x00\xff garbage\n" + b"".join(lines[1:]) + b'{"seq": 1')
    for name in layout.EVENT_NAMES:  # the compacted copies are redundant: drop them
        layout.parquet_path(run_dir, name).unlink(missing_ok=True)
    resumed = cli("run", "--resume", str(run_dir), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert "warning: events/sessions.ndjson: moved 2 damaged line(s) to events/quarantine.ndjson (line 2: " \
           "not UTF-8 text (byte 1)" in resumed.stderr
    assert [r.get("raw_base64") is not None for r in quarantine(run_dir)] == [True, False]
    con = connect(run_dir).con
    assert con.execute("SELECT count(*), max(attempt) FROM sessions WHERE status = 'ok'").fetchone() == (3, 1)

    # Right types, wrong shape: the engine's bookkeeping of a finished session.
    lines = sessions.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        ev = json.loads(line)
        if ev["event"] == "finished":
            lines[i] = json.dumps({**ev, "bookkeeping": {"stateful": [1]}}) + "\n"
            break
    sessions.write_text("".join(lines))
    interrupted(run_dir)
    refused = cli("run", "--resume", str(run_dir), "--quiet")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "the recorded bookkeeping of session" in refused.stderr.strip().splitlines()[-1]
    assert json.loads(layout.manifest_path(run_dir).read_text())["status"] == "interrupted"

    manifest = json.loads(layout.manifest_path(run_dir).read_text())
    manifest["seed"] = [3]
    layout.manifest_path(run_dir).write_text(json.dumps(manifest))
    refused = cli("run", "--resume", str(run_dir), "--quiet")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: cannot resume: {run_dir}/manifest.json: field 'seed' must be an integer, not a list [3]")
    queried = cli("query", str(run_dir), "SELECT count(*) FROM turns")
    assert queried.returncode == 1 and "Traceback" not in queried.stderr
    assert "field 'seed' must be an integer" in queried.stderr


def test_queries_name_lines_damaged_after_the_run_ended(finished_run):
    path = layout.ndjson_path(finished_run, "rewards")
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(2, b'{"seq": "two"}\n')
    path.write_bytes(b"".join(lines))
    store = connect(finished_run)
    assert [c for c, _ in store.warnings] == [DamagedRunWarning]
    assert "events/rewards.ndjson has 1 damaged line(s), skipped (line 3: 'ts' is missing)" in store.warnings[0][1]
    assert store.con.execute("SELECT count(*) FROM events_rewards").fetchone() == (len(lines) - 1,)
