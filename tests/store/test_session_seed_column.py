"""`sessions.seed` (store format 6): a session's sampling seed, on its started line; the
sessions view reads it from the NDJSON and the Parquet copy alike, and a run written
before the column (its lines, or a copy compacted by an older format) reads it as NULL."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from askspec.runtime.store import layout
from askspec.runtime.store.compact import compact_run
from askspec.runtime.store.views import open_store

SQL = "SELECT session_id, seed FROM sessions ORDER BY session_id"


def test_the_seed_is_recorded_and_read_from_either_copy(tmp_path, kit):
    w = kit.new_writer(tmp_path / "runs")
    for i, seed in enumerate([4_294_967_295, 0, None]):  # the largest derive_seed gives; 0; an older writer's
        attempt = w.session_started(f"s{i}", game="g", group_id=None, params={}, index=i,
                                    **({} if seed is None else {"seed": seed}))
        w.session_finished(f"s{i}", attempt, status="ok", outcome=None, error=None, vars={})
    w.finish("finished")
    lines = [json.loads(x) for x in layout.ndjson_path(w.run_dir, "sessions").read_text().splitlines()]
    assert [x.get("seed") for x in lines if x["event"] == "started"] == [4_294_967_295, 0, None]
    assert all("seed" not in x for x in lines if x["event"] == "finished")  # the started line carries it
    want = [("s0", 4_294_967_295), ("s1", 0), ("s2", None)]
    assert open_store(w.run_dir).execute(SQL).fetchall() == want
    compact_run(w.run_dir)
    assert open_store(w.run_dir).execute(SQL).fetchall() == want


def test_a_copy_compacted_before_the_column_reads_it_as_null(tmp_path, kit):
    w = kit.new_writer(tmp_path / "runs")
    for i in range(2):
        kit.play_session(w, i)
    w.finish("finished")
    compact_run(w.run_dir)
    # what a format-5 compactor wrote: the copy without the column, the NDJSON archived
    copy = layout.events_dir(w.run_dir) / "sessions.parquet"
    table = pq.read_table(copy)
    pq.write_table(table.drop_columns(["seed"]), copy)
    index_path = layout.events_dir(w.run_dir) / layout.COMPACTION_INDEX
    index = json.loads(index_path.read_text())
    index["format_version"] = 5
    index_path.write_text(json.dumps(index))
    layout.ndjson_path(w.run_dir, "sessions").write_text("")
    con = open_store(w.run_dir)
    assert con.execute(SQL).fetchall() == [("s0", None), ("s1", None)]
    assert con.execute("SELECT count(*) FROM sessions WHERE status = 'ok'").fetchone() == (2,)
