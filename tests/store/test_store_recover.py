"""A resume never deletes the only copy of a run's events (issue #8 item 4): it rebuilds
NDJSON from a Parquet copy that is the only record, or refuses with an explanation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from askspec.runtime.store import layout
from askspec.runtime.store.compact import CompactError, compact_run
from askspec.runtime.store.views import VIEW_NAMES, connect
from askspec.runtime.store.writer import RunWriter

ROOT = Path(__file__).resolve().parents[2]


def snapshot(run_dir):
    con = connect(run_dir).con
    out = {}
    for view in VIEW_NAMES:
        if view == "runs":
            continue  # status, resumes and ended_at change with a resume
        rows = con.sql(f"SELECT * FROM {view}").to_arrow_table().to_pylist()
        out[view] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return out


def crashed_and_compacted(kit, tmp_path):
    """s0 finished, s1 half-way; the run 'died'; compacted with --force; NDJSON archived."""
    w = kit.new_writer(tmp_path, flush_interval=0)
    kit.play_session(w, 0)
    kit.play_session(w, 1, turns=2, finish=False)
    w.match("g0", a="s0", b="s1", first_shown="a", verdict="A", outcome=1.0, raw="old")
    w.train_step("questioner", 1, {"loss": float("nan")})
    w.close()
    compact_run(w.run_dir, force=True)
    return w.run_dir


def test_resume_of_a_parquet_only_run_rebuilds_the_ndjson(kit, tmp_path):
    run_dir = crashed_and_compacted(kit, tmp_path)
    before = snapshot(run_dir)
    for name in layout.EVENT_NAMES:
        layout.ndjson_path(run_dir, name).unlink()  # archived: the views read Parquet alone
    assert snapshot(run_dir) == before

    w = RunWriter.open_for_resume(run_dir, flush_interval=0)
    assert w.completed_sessions() == {"s0"} and w.attempts() == {"s0": 1, "s1": 1}
    assert "events/turns.ndjson rebuilt from turns.parquet (4 events)" in w.notes
    manifest = layout.read_manifest(run_dir)
    assert {r["file"]: r["rows"] for r in manifest["restored"]}["turns.ndjson"] == 4
    # The rebuilt lines are the events, with the writer's field order and time format.
    first = json.loads(layout.ndjson_path(run_dir, "sessions").read_text().splitlines()[0])
    assert list(first)[:4] == ["seq", "ts", "run_id", "gen"] and first["ts"].endswith("Z")
    assert snapshot(run_dir) == before  # nothing lost, nothing changed
    assert kit.play_session(w, 1, turns=3) == 2
    w.finish()
    after = snapshot(run_dir)
    assert after["sessions"] != before["sessions"]
    con = connect(run_dir).con
    assert con.execute("SELECT session_id, attempt, status FROM sessions ORDER BY 1").fetchall() == [
        ("s0", 1, "ok"), ("s1", 2, "ok")]
    assert con.execute("SELECT count(*) FROM turns WHERE session_id = 's0'").fetchone() == (2,)
    assert con.execute("SELECT raw FROM matches").fetchall() == [("old",)]
    # a non-finite float is written as null, in a free-form value too (never a bare NaN)
    assert con.execute("SELECT metrics->>'$.loss' FROM train_steps").fetchall() == [(None,)]


def test_emptied_ndjson_is_rebuilt_too(kit, tmp_path):
    run_dir = crashed_and_compacted(kit, tmp_path)
    before = snapshot(run_dir)
    layout.ndjson_path(run_dir, "turns").write_bytes(b"")
    assert snapshot(run_dir) == before  # the views read the copy: it has what the NDJSON lost
    RunWriter.open_for_resume(run_dir).finish()
    assert snapshot(run_dir) == before
    assert layout.ndjson_path(run_dir, "turns").read_text().count("\n") == 4


def test_resume_refuses_when_the_ndjson_shrank_and_changes_nothing(kit, tmp_path):
    run_dir = crashed_and_compacted(kit, tmp_path)
    path = layout.ndjson_path(run_dir, "turns")
    path.write_bytes(path.read_bytes().splitlines(keepends=True)[0])
    files = {p.name: p.read_bytes() for p in (run_dir / "events").iterdir() if p.is_file()}
    manifest = layout.manifest_path(run_dir).read_bytes()
    with pytest.raises(layout.RunDirError, match=r"turns\.ndjson \(\d+ bytes\) is shorter than when turns\.parquet"):
        RunWriter.open_for_resume(run_dir)
    assert {p.name: p.read_bytes() for p in (run_dir / "events").iterdir() if p.is_file()} == files
    assert layout.manifest_path(run_dir).read_bytes() == manifest
    with pytest.raises(CompactError, match="shorter than when"):
        compact_run(run_dir, force=True)
    assert layout.parquet_path(run_dir, "turns").read_bytes() == files["turns.parquet"]


def test_resume_refuses_a_missing_event_file_without_a_copy(kit, tmp_path):
    w = kit.new_writer(tmp_path)
    kit.play_session(w, 0)
    w.close()
    layout.ndjson_path(w.run_dir, "rewards").unlink()
    with pytest.raises(layout.RunDirError, match=r"rewards\.ndjson is missing and there is no Parquet copy"):
        RunWriter.open_for_resume(w.run_dir)
    assert not layout.ndjson_path(w.run_dir, "rewards").exists()


def test_a_copy_with_events_the_ndjson_lacks_is_never_dropped(kit, tmp_path):
    """A copy beside a grown NDJSON that is not a prefix of it (someone replaced the file)."""
    run_dir = crashed_and_compacted(kit, tmp_path)
    path = layout.ndjson_path(run_dir, "train_steps")
    ev = json.loads(path.read_text())
    ev.update(seq=7, ts="2030-01-01T00:00:00.000000Z", step=9)
    path.write_text(json.dumps(ev) + "\n" + json.dumps({**ev, "seq": 8}) + "\n")  # longer, other events
    pq = layout.parquet_path(run_dir, "train_steps").read_bytes()
    with pytest.raises(layout.RunDirError, match=r"train_steps\.parquet holds 1 event\(s\) that train_steps\.ndjson lacks"):
        RunWriter.open_for_resume(run_dir)
    with pytest.raises(CompactError, match="holds events that train_steps.ndjson lacks"):
        compact_run(run_dir, force=True)
    assert layout.parquet_path(run_dir, "train_steps").read_bytes() == pq


def test_compaction_keeps_a_parquet_only_copy(kit, tmp_path):
    run_dir = crashed_and_compacted(kit, tmp_path)
    before = snapshot(run_dir)
    layout.ndjson_path(run_dir, "turns").unlink()
    compact_run(run_dir, force=True)
    assert layout.parquet_path(run_dir, "turns").exists()
    assert "turns" in layout.read_compaction_index(run_dir)["files"]
    assert snapshot(run_dir) == before


def test_parquet_copies_from_format_1_still_read_and_restore(kit, tmp_path):
    """A copy compacted before prompt deltas and overflow existed lacks their columns."""
    run_dir = crashed_and_compacted(kit, tmp_path)
    before = snapshot(run_dir)
    con = duckdb.connect()
    for name in layout.EVENT_NAMES:
        pq = layout.parquet_path(run_dir, name)
        old = [c for c in layout.columns(name) if c not in layout.ADDED_COLUMNS[name]]
        tmp = pq.with_suffix(".v1")
        con.execute(f"COPY (SELECT {', '.join(old)} FROM read_parquet('{pq}')) TO '{tmp}' (FORMAT parquet)")
        tmp.replace(pq)
        layout.ndjson_path(run_dir, name).unlink()
    index = layout.read_compaction_index(run_dir)
    del index["format_version"]
    (run_dir / "events" / "compaction.json").write_text(json.dumps(index))
    assert snapshot(run_dir) == before
    (run_dir / "events" / "compaction.json").unlink()  # and without an index at all
    assert snapshot(run_dir) == before
    RunWriter.open_for_resume(run_dir).finish()
    assert snapshot(run_dir) == before


PYMODEL = '''
def reply(messages, request):
    return f"#Answer# {request.session_index}-{request.call_index}"
'''

SPEC = """
experiment archived { param n: int = 4  seed = 3 }
model m = python("archived_model:reply")
role player { model = m; memory = full; reply = sections("#Answer#"); prompt = "Turn {{ t }}." }
game play for i in range(0, n) {
    repeat t in 1..3 { r = ask player }
}
"""


def _cli(tmp_path, *args):
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "askspec.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)


def test_cli_resume_of_an_archived_run_replays_nothing(tmp_path):
    (tmp_path / "archived_model.py").write_text(PYMODEL)
    spec = tmp_path / "archived.ask"
    spec.write_text(SPEC)
    done = _cli(tmp_path, "run", str(spec), "--out", str(tmp_path / "runs"), "--quiet")
    assert done.returncode == 0, done.stderr
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    assert layout.parquet_path(run_dir, "turns").exists()  # a finished run is compacted
    before = snapshot(run_dir)
    for name in layout.EVENT_NAMES:
        layout.ndjson_path(run_dir, name).unlink()
    manifest = json.loads(layout.manifest_path(run_dir).read_text())  # as if interrupted after its sessions
    manifest["status"] = "interrupted"  # (a finished run has nothing to resume: --resume says so)
    layout.manifest_path(run_dir).write_text(json.dumps(manifest))
    resumed = _cli(tmp_path, "run", "--resume", str(run_dir), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr and "rebuilt from turns.parquet" in resumed.stderr
    assert snapshot(run_dir) == before  # the same events: no session was played again
    con = connect(run_dir).con
    assert con.execute("SELECT count(*), max(attempt) FROM sessions").fetchone() == (4, 1)
    assert con.execute("SELECT status FROM runs").fetchone() == ("finished",)


def test_a_corrupt_only_copy_is_a_clear_refusal(kit, tmp_path):
    run_dir = crashed_and_compacted(kit, tmp_path)
    layout.ndjson_path(run_dir, "turns").unlink()
    pq = layout.parquet_path(run_dir, "turns")
    pq.write_bytes(pq.read_bytes()[:100])
    with pytest.raises(layout.RunDirError, match=r"cannot rebuild .*turns\.ndjson from turns\.parquet, the only copy"):
        RunWriter.open_for_resume(run_dir)
    assert pq.stat().st_size == 100 and not layout.ndjson_path(run_dir, "turns").exists()


def test_parquet_copies_from_format_2_lack_train_steps_skipped_and_still_read(kit, tmp_path):
    """A copy compacted by format 2 has no `train_steps.skipped` (format 3): read as NULL."""
    run_dir = crashed_and_compacted(kit, tmp_path)
    before = snapshot(run_dir)
    assert [r["skipped"] for r in map(json.loads, before["train_steps"])] == [None]
    pq = layout.parquet_path(run_dir, "train_steps")
    old = [c for c in layout.columns("train_steps") if c != "skipped"]
    tmp = pq.with_suffix(".v2")
    duckdb.connect().execute(f"COPY (SELECT {', '.join(old)} FROM read_parquet('{pq}')) TO '{tmp}' (FORMAT parquet)")
    tmp.replace(pq)
    layout.ndjson_path(run_dir, "train_steps").unlink()
    index = layout.read_compaction_index(run_dir)
    index["format_version"] = 2
    (run_dir / "events" / "compaction.json").write_text(json.dumps(index))
    assert snapshot(run_dir) == before
