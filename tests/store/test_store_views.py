"""Store views: round trip, several runs, empty and missing files, torn last lines."""

from __future__ import annotations

import json
import warnings

import pytest

from askspec.runtime.store import layout
from askspec.runtime.store.views import (
    VIEW_NAMES,
    DamagedRunWarning,
    PartialLineWarning,
    StoreError,
    connect,
    open_store,
)


def rows(con, sql):
    return con.sql(sql).to_arrow_table().to_pylist()


def test_round_trip(finished_run):
    con = open_store(finished_run)
    run_id = layout.read_manifest(finished_run)["run_id"]
    (run,) = rows(con, "SELECT * FROM runs")
    assert run["run_id"] == run_id and run["experiment"] == "demo" and run["status"] == "finished"
    assert run["seed"] == 7 and run["planned_sessions"] == 4 and run["ended_at"] >= run["started_at"]
    assert run["run_dir"] == str(finished_run.resolve())
    assert json.loads(run["roles"])["questioner"]["backend"] == "replay"

    sess = rows(con, "SELECT * FROM sessions ORDER BY session_id")
    assert [s["session_id"] for s in sess] == ["s0", "s1", "s2", "s3"]
    assert [s["status"] for s in sess] == ["ok", "ok", "ok", "error"]
    assert sess[3]["outcome"] is None and sess[3]["error"] == "boom"
    assert sess[0]["game"] == "calibrate" and sess[0]["group_id"] == "g0" and sess[0]["index"] == 0
    assert json.loads(sess[1]["params"]) == {"a": "m1", "b": "m9"}
    assert json.loads(sess[2]["vars"]) == {"i": 2}
    assert all(s["run_id"] == run_id and s["ended_at"] >= s["started_at"] for s in sess)

    turns = rows(con, "SELECT * FROM turns ORDER BY session_id, turn_index")
    assert len(turns) == 8
    t = turns[1]
    assert (t["session_id"], t["turn_index"], t["role"], t["model"]) == ("s0", 1, "judge", "smollm2-135m")
    assert json.loads(t["prompt"]) == [{"role": "user", "content": "q0.1 attempt 1"}]
    assert t["text"] == "#Question# what is 0+1?\nline two"
    assert json.loads(t["parsed"]) == {"question": "0+1"}
    assert (t["finish_reason"], t["tokens_in"], t["tokens_out"], t["latency_ms"]) == ("stop", 11, 5, 1.5)

    rw = rows(con, "SELECT * FROM rewards WHERE session_id = 's0' ORDER BY name, turn_index")
    assert [(r["name"], r["turn_index"], r["kind"], r["value"]) for r in rw] == [
        ("calibration", None, "terminal", 1.0), ("format", 0, "turn", 0.0), ("format", 1, "turn", 0.1)]

    (g,) = rows(con, "SELECT * FROM groups")
    assert g["route"] == "tournament" and json.loads(g["stats"]) == {"var": 0.0}
    assert g["members"] == ["s0", "s1"]
    m = rows(con, "SELECT * FROM matches ORDER BY a")
    assert [(x["a"], x["b"], x["first_shown"], x["verdict"], x["outcome"]) for x in m] == [
        ("s0", "s1", "b", "A", 0.9), ("s1", "s0", "a", "B", 0.1)]
    ts = rows(con, "SELECT role, step, metrics->>'$.loss' AS loss FROM train_steps ORDER BY step")
    assert ts == [{"role": "questioner", "step": 1, "loss": "0.5"},
                  {"role": "questioner", "step": 2, "loss": "0.25"}]


def test_json_columns_have_json_type(finished_run):
    con = open_store(finished_run)
    types = {}
    for view in VIEW_NAMES:
        for name, typ, *_ in con.sql(f"DESCRIBE {view}").fetchall():
            types[(view, name)] = typ
    for key in [("sessions", "params"), ("sessions", "vars"), ("turns", "prompt"), ("turns", "parsed"),
                ("groups", "stats"), ("train_steps", "metrics"), ("runs", "roles")]:
        assert types[key] == "JSON", key
    assert types[("turns", "tokens_in")] == "INTEGER" and types[("rewards", "value")] == "DOUBLE"
    assert types[("sessions", "started_at")] == "TIMESTAMP"


def test_running_session_and_live_manifest(kit, tmp_path):
    w = kit.new_writer(tmp_path, flush_interval=0)
    kit.play_session(w, 0)
    kit.play_session(w, 1, finish=False)
    con = open_store(w.run_dir)
    assert rows(con, "SELECT session_id, status FROM sessions ORDER BY 1") == [
        {"session_id": "s0", "status": "ok"}, {"session_id": "s1", "status": "running"}]
    assert rows(con, "SELECT status FROM runs") == [{"status": "running"}]
    # The same connection sees later events and the final manifest (views read live).
    w.session_finished("s1", 1, status="ok", outcome="too_easy", error=None, vars={})
    w.finish()
    assert rows(con, "SELECT count(*) AS n FROM sessions WHERE status = 'ok'") == [{"n": 2}]
    assert rows(con, "SELECT status FROM runs") == [{"status": "finished"}]


def test_folder_of_two_runs(kit, tmp_path):
    out = tmp_path / "runs"
    w1 = kit.new_writer(out, experiment="ask_e")
    for i in range(3):
        kit.play_session(w1, i)
    w1.finish()
    w2 = kit.new_writer(out, experiment="askbench")
    kit.play_session(w2, 0, turns=3)
    w2.finish("interrupted")
    (out / "not-a-run").mkdir()  # ignored: no manifest
    con = open_store(out)
    assert rows(con, "SELECT experiment, status FROM runs ORDER BY experiment") == [
        {"experiment": "ask_e", "status": "finished"}, {"experiment": "askbench", "status": "interrupted"}]
    per_run = rows(con, """SELECT r.experiment, count(*) AS turns FROM turns t JOIN runs r USING (run_id)
                           GROUP BY ALL ORDER BY 1""")
    assert per_run == [{"experiment": "ask_e", "turns": 6}, {"experiment": "askbench", "turns": 3}]
    # Same session id in two runs stays two sessions.
    assert rows(con, "SELECT count(*) AS n FROM sessions WHERE session_id = 's0'") == [{"n": 2}]


def test_empty_and_missing_event_files(kit, tmp_path):
    w = kit.new_writer(tmp_path)
    w.finish()
    layout.ndjson_path(w.run_dir, "matches").unlink()
    layout.ndjson_path(w.run_dir, "turns").unlink()
    with pytest.warns(DamagedRunWarning, match=r"events/turns\.ndjson is missing; no turns events"):
        con = open_store(w.run_dir)
    for view in VIEW_NAMES:
        n = con.execute(f"SELECT count(*) FROM {view}").fetchone()[0]
        assert n == (1 if view == "runs" else 0), view
    assert con.execute("SELECT avg(latency_ms) FROM turns").fetchone() == (None,)


def test_truncated_last_line_is_ignored_with_a_warning(finished_run):
    path = layout.ndjson_path(finished_run, "turns")
    full = path.read_bytes()
    torn = full + full.splitlines(keepends=True)[0][:57]  # crash mid-line
    path.write_bytes(torn)
    with pytest.warns(PartialLineWarning, match=r"turns\.ndjson ends with a partial line \(57 bytes"):
        con = open_store(finished_run)
    assert con.execute("SELECT count(*) FROM turns").fetchone() == (8,)
    assert con.execute("SELECT count(*) FROM events_turns").fetchone() == (8,)
    # A torn line that cuts inside a nested JSON value or right after '{' behaves the same.
    for cut in (1, 2, len(full.splitlines()[0]) - 1):
        path.write_bytes(full + full.splitlines(keepends=True)[0][:cut])
        store = connect(finished_run)
        assert store.con.execute("SELECT count(*) FROM turns").fetchone() == (8,)
        assert [c for c, _ in store.warnings] == [PartialLineWarning]


def test_clean_store_has_no_warnings(finished_run):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_store(finished_run)


def test_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="no such directory"):
        connect(tmp_path / "missing")
    with pytest.raises(StoreError, match="not a run directory"):
        connect(tmp_path)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        connect(tmp_path / "f.txt")


def test_time_to_first_token_round_trips_and_is_null_where_not_reported(kit, tmp_path):
    from askspec.runtime.store.compact import compact_run

    w = kit.new_writer(tmp_path / "runs")
    attempt = w.session_started("s0", game="g", group_id=None, params={}, index=0)
    for t, ttft in enumerate((12.25, None)):
        w.turn("s0", attempt, turn_index=t, role="q", model="m", prompt=[{"role": "user", "content": f"p{t}"}],
               text="x", parsed={}, finish_reason="stop", tokens_in=3, tokens_out=1, latency_ms=20.0, ttft_ms=ttft)
    w.session_finished("s0", attempt, status="ok", outcome=None, error=None, vars={})
    w.finish("finished")
    lines = [json.loads(x) for x in layout.ndjson_path(w.run_dir, "turns").read_text().splitlines()]
    assert lines[0]["ttft_ms"] == 12.25 and "ttft_ms" not in lines[1]  # absent, not null, when not reported
    sql = "SELECT turn_index, ttft_ms FROM turns ORDER BY turn_index"
    assert rows(open_store(w.run_dir), sql) == [{"turn_index": 0, "ttft_ms": 12.25}, {"turn_index": 1, "ttft_ms": None}]
    compact_run(w.run_dir)
    assert rows(open_store(w.run_dir), sql) == [{"turn_index": 0, "ttft_ms": 12.25}, {"turn_index": 1, "ttft_ms": None}]


def test_sessions_step_stage_and_weights_are_columns_and_older_runs_read_theirs_from_params(kit, tmp_path):
    """A training run's session records its step, stage and weights as columns (store
    format 4); a run written before kept them in params as __step__, __stage__,
    __weights__: the sessions view and the metrics' scopes read either the same way."""
    from askspec.runtime.engine.metrics import session_scopes
    from askspec.runtime.store.compact import compact_run

    w = kit.new_writer(tmp_path / "runs")
    plays = [("s0", {"x": 1}, dict(step=3, stage="rl")), ("s1", {"x": 2}, dict(step=4, stage="heldout", weights="initial")),
             ("s2", {"x": 3, "__step__": 2, "__stage__": "warmup", "__weights__": "trained"}, {}),  # format < 4
             ("s3", {"x": 4}, {})]  # an evaluation run's
    for i, (sid, params, trained) in enumerate(plays):
        attempt = w.session_started(sid, game="g", group_id=None, params=params, index=i, **trained)
        w.session_finished(sid, attempt, status="ok", outcome=None, error=None, vars={})
    w.finish("finished")
    lines = [json.loads(x) for x in layout.ndjson_path(w.run_dir, "sessions").read_text().splitlines()]
    assert "step" not in lines[-2] and "step" not in lines[-4]  # an evaluation run's lines stay as they were
    want = [{"session_id": "s0", "step": 3, "stage": "rl", "weights": None},
            {"session_id": "s1", "step": 4, "stage": "heldout", "weights": "initial"},
            {"session_id": "s2", "step": 2, "stage": "warmup", "weights": "trained"},
            {"session_id": "s3", "step": None, "stage": None, "weights": None}]
    sql = "SELECT session_id, step, stage, weights FROM sessions ORDER BY session_id"
    assert rows(open_store(w.run_dir), sql) == want
    compact_run(w.run_dir)
    con = open_store(w.run_dir)
    assert rows(con, sql) == want
    scopes, _ = session_scopes(con)
    got = sorted((s.vars["x"], s.vars["step"], s.vars["stage"], s.vars["weights"]) for s in scopes)
    assert got == [(1, 3, "rl", None), (2, 4, "heldout", "initial"), (3, 2, "warmup", "trained"), (4, None, None, None)]
    assert not any(k.startswith("__") for s in scopes for k in s.vars)
