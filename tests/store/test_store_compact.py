"""Compaction to Parquet is transparent to the views, and never used when stale."""

from __future__ import annotations

import json

import pytest

from askspec.runtime.store import layout
from askspec.runtime.store.compact import CompactError, compact_run
from askspec.runtime.store.views import VIEW_NAMES, StaleParquetWarning, connect
from askspec.runtime.store.writer import RunWriter


def snapshot(run_dir):
    """Every view's rows, order-independent, JSON-comparable."""
    con = connect(run_dir).con
    out = {}
    for view in VIEW_NAMES:
        rows = con.sql(f"SELECT * FROM {view}").to_arrow_table().to_pylist()
        out[view] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return out


def source_of(run_dir, name):
    con = connect(run_dir).con
    (sql,) = con.execute(
        f"SELECT sql FROM duckdb_views() WHERE view_name = 'events_{name}'").fetchone()
    return "parquet" if "read_parquet" in sql else "ndjson"


def resumed_run(kit, tmp_path):
    """A run with two attempts of one session, a torn line, and all event kinds."""
    w = kit.new_writer(tmp_path, flush_interval=0)
    kit.play_session(w, 0)
    kit.play_session(w, 1, finish=False)
    w.match("g0", a="s0", b="s1", first_shown="a", verdict="A", outcome=1.0, raw="old")
    w.close()
    with open(layout.ndjson_path(w.run_dir, "rewards"), "ab") as f:
        f.write(b'{"seq":1000,"run_')
    w = RunWriter.open_for_resume(w.run_dir, flush_interval=0)
    kit.play_session(w, 1, turns=3)
    kit.play_session(w, 2, status="error", outcome=None)
    w.match("g0", a="s1", b="s0", first_shown="b", verdict="Tie", outcome=0.5, raw="new")
    w.group("g0", route="tournament", stats={"var": 0}, members=["s0", "s1"])
    w.train_step("questioner", 1, {"loss": 0.3})
    w.finish()
    return w.run_dir


def test_compaction_is_transparent(kit, tmp_path):
    run_dir = resumed_run(kit, tmp_path)
    before = snapshot(run_dir)
    assert all(source_of(run_dir, n) == "ndjson" for n in layout.EVENT_NAMES)
    ndjson_before = {n: layout.ndjson_path(run_dir, n).read_bytes() for n in layout.EVENT_NAMES}

    counts = compact_run(run_dir)
    assert counts["turns"] == 2 + 2 + 3 + 2  # every attempt is kept; views filter
    for name in layout.EVENT_NAMES:
        assert layout.parquet_path(run_dir, name).is_file()
        assert source_of(run_dir, name) == "parquet"
        # NDJSON stays in place, untouched.
        assert layout.ndjson_path(run_dir, name).read_bytes() == ndjson_before[name]
    index = json.loads((run_dir / "events" / "compaction.json").read_text())
    assert index["files"]["turns"]["rows"] == counts["turns"]
    assert not list((run_dir / "events").glob(".*.tmp"))

    assert snapshot(run_dir) == before
    # Compacting again is harmless.
    compact_run(run_dir)
    assert snapshot(run_dir) == before


def test_compacted_parquet_types_match(finished_run):
    con = connect(finished_run).con
    before = {v: con.sql(f"DESCRIBE {v}").fetchall() for v in VIEW_NAMES}
    compact_run(finished_run)
    con = connect(finished_run).con
    assert {v: con.sql(f"DESCRIBE {v}").fetchall() for v in VIEW_NAMES} == before


def test_stale_parquet_is_ignored(finished_run):
    compact_run(finished_run)
    # Someone appends after compaction: the copy no longer matches its NDJSON.
    line = layout.ndjson_path(finished_run, "train_steps").read_bytes().splitlines()[-1]
    ev = json.loads(line)
    ev.update(seq=ev["seq"] + 1, step=3)
    with open(layout.ndjson_path(finished_run, "train_steps"), "a") as f:
        f.write(json.dumps(ev) + "\n")
    store = connect(finished_run)
    assert [c for c, _ in store.warnings] == [StaleParquetWarning]
    assert store.con.execute("SELECT max(step) FROM train_steps").fetchone() == (3,)
    assert source_of(finished_run, "turns") == "parquet"


def test_resume_drops_parquet_copies(finished_run):
    compact_run(finished_run)
    RunWriter.open_for_resume(finished_run).finish()
    assert not list((finished_run / "events").glob("*.parquet"))
    assert not (finished_run / "events" / "compaction.json").exists()


def test_interrupted_compaction_is_not_used(finished_run):
    compact_run(finished_run)
    (finished_run / "events" / "compaction.json").unlink()  # as if it died before the index
    assert source_of(finished_run, "turns") == "ndjson"
    assert connect(finished_run).warnings == []


def test_refuses_running_runs(kit, tmp_path):
    w = kit.new_writer(tmp_path)
    kit.play_session(w, 0)
    w.flush()
    with pytest.raises(CompactError, match="still running"):
        compact_run(w.run_dir)
    with pytest.raises(CompactError, match="another process"):
        compact_run(w.run_dir, force=True)  # the writer is alive
    w.close()  # dies without finish(): status stays running
    compact_run(w.run_dir, force=True)
    assert source_of(w.run_dir, "turns") == "parquet"
    with pytest.raises(CompactError, match="not a run directory"):
        compact_run(tmp_path)


def test_finish_can_compact(kit, tmp_path):
    w = kit.new_writer(tmp_path)
    kit.play_session(w, 0)
    w.finish(compact=True)
    assert source_of(w.run_dir, "turns") == "parquet"
    assert connect(w.run_dir).con.execute("SELECT count(*) FROM turns").fetchone() == (2,)


def test_turns_copy_is_sorted_by_session_for_row_group_pruning(kit, tmp_path):
    """Sessions run interleaved; the Parquet copy of the turns is ordered by session, so
    that a reader of one session's turns can skip other sessions' row groups."""
    import duckdb

    w = kit.new_writer(tmp_path, flush_interval=0)
    started = {}
    for i in (2, 0, 1):
        started[f"s{i}"] = w.session_started(f"s{i}", game="calibrate", group_id=None, params={}, index=i)
    for t in range(3):  # round-robin: s2, s0, s1, s2, s0, s1, ...
        for sid in ("s2", "s0", "s1"):
            w.turn(sid, started[sid], turn_index=t, role="questioner", model="m", prompt=[], text=f"{sid} {t}",
                   parsed={}, finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=1.0)
    for sid in ("s2", "s0", "s1"):
        w.session_finished(sid, started[sid], status="ok", outcome="done", error=None, vars={})
    w.finish()
    before = snapshot(w.run_dir)
    compact_run(w.run_dir)
    order = duckdb.sql(f"SELECT session_id, turn_index FROM read_parquet('{layout.parquet_path(w.run_dir, 'turns')}')"
                       ).fetchall()
    assert order == [(s, t) for s in ("s0", "s1", "s2") for t in range(3)]
    assert snapshot(w.run_dir) == before


def test_turns_copy_has_small_row_groups(kit, tmp_path):
    """A session's turns are read from the copy by row group (the TUI's transcript): the
    groups are small (``ROW_GROUP_ROWS``), not DuckDB's default of 122,880 rows, so that
    the one holding a session is cheap to decompress."""
    import duckdb

    from askspec.runtime.store.compact import ROW_GROUP_ROWS

    w = kit.new_writer(tmp_path, flush_interval=0)
    for i in range(30):
        sid = f"s{i:03d}"
        att = w.session_started(sid, game="calibrate", group_id=None, params={}, index=i)
        for t in range(400):
            w.turn(sid, att, turn_index=t, role="questioner", model="m", prompt=[], text=f"{sid} {t}",
                   parsed={}, finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=1.0)
        w.session_finished(sid, att, status="ok", outcome="done", error=None, vars={})
    w.finish()
    compact_run(w.run_dir)
    path = layout.parquet_path(w.run_dir, "turns")
    ((groups, largest),) = duckdb.connect().execute(
        f"SELECT count(DISTINCT row_group_id), max(row_group_num_rows) FROM parquet_metadata('{path}')").fetchall()
    assert largest <= ROW_GROUP_ROWS["turns"] and groups >= 12000 // ROW_GROUP_ROWS["turns"]
    assert connect(w.run_dir).con.execute("SELECT count(*) FROM turns").fetchone() == (12000,)
