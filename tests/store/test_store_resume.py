"""Resume: attempts, latest-attempt views, append-only files, torn-line repair."""

from __future__ import annotations

import json

import pytest

from askspec.runtime.store import layout
from askspec.runtime.store.views import DamagedRunWarning, connect
from askspec.runtime.store.writer import RunWriter


def rows(con, sql):
    return con.sql(sql).to_arrow_table().to_pylist()


def crashed_run(kit, tmp_path):
    """s0 finished, s1 half-way (2 turns, attempt 1); then a torn turns line, no finish()."""
    w = kit.new_writer(tmp_path, flush_interval=0)
    kit.play_session(w, 0)
    kit.play_session(w, 1, turns=2, finish=False)
    w.match("g9", a="s0", b="s1", first_shown="a", verdict="A", outcome=1.0, raw="gen0")
    w.train_step("questioner", 1, {"loss": 9.0})
    w.close()  # the process "dies": manifest still says running
    with open(layout.ndjson_path(w.run_dir, "turns"), "ab") as f:
        f.write(b'{"seq":99,"ts":"2026-01-01T00:00:00.000000Z","run_id":"x","session_id":"s1","att')
    return w.run_dir


def test_resume_attempts_and_latest_attempt_views(kit, tmp_path):
    run_dir = crashed_run(kit, tmp_path)
    before = {n: layout.ndjson_path(run_dir, n).read_bytes() for n in layout.EVENT_NAMES}

    w = RunWriter.open_for_resume(run_dir, flush_interval=0)
    assert w.generation == 1
    assert w.completed_sessions() == {"s0"}
    assert w.attempts() == {"s0": 1, "s1": 1}
    m = layout.read_manifest(run_dir)
    assert m["status"] == "running" and m["resumes"] == 1 and m["ended_at"] is None
    assert [h["gen"] for h in m["history"]] == [0, 1] and m["history"][0]["status"] == "interrupted"
    # The torn line moved, byte for byte, to the quarantine file; the rest is untouched.
    torn = b'{"seq":99,"ts":"2026-01-01T00:00:00.000000Z","run_id":"x","session_id":"s1","att'
    assert before["turns"].endswith(torn)
    assert m["quarantined"] == [{"file": "turns.ndjson", "lines": 1, "gen": 1}]
    (q,) = [json.loads(line) for line in (run_dir / "events" / "quarantine.ndjson").read_text().splitlines()]
    assert q["file"] == "turns.ndjson" and q["raw"] == torn.decode() and q["line"] == 5
    assert q["offset"] == len(before["turns"]) - len(torn) and "partial last line" in q["reason"]
    before["turns"] = before["turns"][: -len(torn)]
    assert w.notes == ["events/turns.ndjson: moved 1 damaged line(s) to events/quarantine.ndjson "
                       f"(line 5: {q['reason']})"]

    # Re-run the unfinished session: attempt 2, now with 3 turns; redo the tournament.
    assert kit.play_session(w, 1, turns=3) == 2
    w.match("g9", a="s1", b="s0", first_shown="b", verdict="B", outcome=0.0, raw="gen1")
    w.train_step("questioner", 1, {"loss": 1.0})
    # A reward of the finished s0 recomputed in this generation supersedes the old line.
    w.reward("s0", 1, role="questioner", turn_index=None, name="calibration", value=0.5,
             kind="terminal")
    w.finish()

    # Append-only: every old byte is still there, unchanged, at the same offset.
    for name, old in before.items():
        assert layout.ndjson_path(run_dir, name).read_bytes()[: len(old)] == old, name
    # seq keeps increasing across the resume in every file.
    for name in layout.EVENT_NAMES:
        seqs = []
        for line in layout.ndjson_path(run_dir, name).read_bytes().splitlines():
            seqs.append(json.loads(line)["seq"])  # every line is whole: the torn one was moved
        assert seqs == sorted(set(seqs)), name

    store = connect(run_dir)
    assert [c for c, _ in store.warnings] == [DamagedRunWarning]
    assert "1 damaged line(s) of turns.ndjson were moved to events/quarantine.ndjson" in store.warnings[0][1]
    con = store.con
    assert rows(con, "SELECT session_id, status, attempt FROM sessions ORDER BY 1") == [
        {"session_id": "s0", "status": "ok", "attempt": 1},
        {"session_id": "s1", "status": "ok", "attempt": 2}]
    t = rows(con, "SELECT session_id, turn_index, attempt, prompt->>'$[0].content' AS c "
                  "FROM turns ORDER BY 1, 2")
    assert [(r["session_id"], r["turn_index"], r["attempt"]) for r in t] == [
        ("s0", 0, 1), ("s0", 1, 1), ("s1", 0, 2), ("s1", 1, 2), ("s1", 2, 2)]
    assert t[2]["c"] == "q1.0 attempt 2"
    assert rows(con, "SELECT count(*) AS n FROM rewards WHERE session_id = 's1'") == [{"n": 4}]
    assert rows(con, "SELECT max(attempt) AS a FROM rewards WHERE session_id = 's1'") == [{"a": 2}]
    # The raw stream still has everything, including the superseded attempt.
    assert rows(con, "SELECT count(*) AS n FROM events_turns WHERE session_id = 's1'") == [{"n": 5}]
    assert rows(con, "SELECT value FROM rewards WHERE session_id = 's0' AND name = 'calibration'") == [
        {"value": 0.5}]
    assert rows(con, "SELECT count(*) AS n FROM rewards WHERE session_id = 's0'") == [{"n": 3}]
    assert rows(con, "SELECT raw FROM matches") == [{"raw": "gen1"}]
    assert rows(con, "SELECT metrics->>'$.loss' AS loss FROM train_steps") == [{"loss": "1.0"}]


def test_resume_of_a_clean_run_changes_nothing(kit, finished_run):
    before = {n: layout.ndjson_path(finished_run, n).read_bytes() for n in layout.EVENT_NAMES}
    w = RunWriter.open_for_resume(finished_run)
    assert w.completed_sessions() == {"s0", "s1", "s2", "s3"}
    w.finish()
    after = {n: layout.ndjson_path(finished_run, n).read_bytes() for n in layout.EVENT_NAMES}
    assert after == before
    assert layout.read_manifest(finished_run)["repairs"] == []


def test_resume_twice(kit, tmp_path):
    run_dir = crashed_run(kit, tmp_path)
    w = RunWriter.open_for_resume(run_dir, flush_interval=0)
    assert kit.play_session(w, 1, finish=False) == 2
    w.close()  # crashes again
    w = RunWriter.open_for_resume(run_dir, flush_interval=0)
    assert w.generation == 2 and w.attempts()["s1"] == 2
    assert kit.play_session(w, 1) == 3
    w.finish()
    con = connect(run_dir).con
    assert rows(con, "SELECT DISTINCT attempt FROM turns WHERE session_id = 's1'") == [{"attempt": 3}]


def test_resume_requires_a_run_dir(tmp_path):
    with pytest.raises(FileNotFoundError):
        RunWriter.open_for_resume(tmp_path)
