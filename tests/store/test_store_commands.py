"""CLI subcommands: outputs, argparse wiring and error paths (one line, exit code 1)."""

from __future__ import annotations

import argparse
import csv
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from askspec.runtime.store import layout
from askspec.runtime.commands.query import format_table, query, register
from askspec.runtime.commands.runs import list_runs
from askspec.runtime.commands.runs import register as register_runs
from askspec.runtime.store.readonly import QueryRefused


def cli(*argv):
    parser = argparse.ArgumentParser(prog="askspec")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    register_runs(sub)
    args = parser.parse_args([str(a) for a in argv])
    return args.func(args)


def assert_one_line_error(capsys, rc, match):
    out, err = capsys.readouterr()
    assert rc == 1
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert match in err and "Traceback" not in err


def test_query_table(finished_run, capsys):
    rc = cli("query", finished_run, "SELECT session_id, status, outcome, 1.5 AS x, params "
                                    "FROM sessions ORDER BY session_id", "--max-width", "12")
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["session_id", "status", "outcome", "x", "params"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split()[:3] == ["s0", "ok", "calibrated"]
    assert "NULL" in lines[5]  # s3's outcome
    assert lines[2].endswith('{"a":"m0","…')  # cut to 12 characters
    assert lines[-1] == "(4 rows)"
    widths = {len(line) for line in lines[:-1]}
    assert max(widths) == len(lines[1])  # aligned


def test_query_csv_and_json(finished_run, capsys):
    assert cli("query", finished_run, "SELECT session_id, turn_index, text, parsed FROM turns "
                                      "ORDER BY 1, 2 LIMIT 2", "--format", "csv") == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["session_id", "turn_index", "text", "parsed"]
    assert rows[1] == ["s0", "0", "#Question# what is 0+0?\nline two", '{"question":"0+0"}']
    assert cli("query", finished_run, "SELECT session_id, params, started_at, error FROM sessions "
                                      "ORDER BY 1", "--format", "json") == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data) == 4 and data[0]["params"] == {"a": "m0", "b": "m9"}
    assert data[0]["error"] is None and data[0]["started_at"].startswith("20")


def test_query_function_and_statements(finished_run):
    t = query(finished_run, "SELECT role, count(*) AS n FROM turns GROUP BY role ORDER BY role")
    assert isinstance(t, pa.Table)
    assert t.to_pylist() == [{"role": "judge", "n": 4}, {"role": "questioner", "n": 4}]
    # Only queries run: the store is read-only (tests/store/test_store_readonly.py).
    with pytest.raises(QueryRefused, match="CREATE refused"):
        query(finished_run, "CREATE TABLE x AS SELECT 1")


def test_runs(kit, tmp_path, capsys, monkeypatch):
    out = tmp_path / "runs"
    w1 = kit.new_writer(out, experiment="ask_e")
    for i in range(3):
        kit.play_session(w1, i, status="error" if i == 2 else "ok")
    w1.finish()
    w2 = kit.new_writer(out, experiment="soar")
    kit.play_session(w2, 0, finish=False)
    w2.flush()
    monkeypatch.chdir(tmp_path)
    assert cli("runs") == 0  # default DIR is ./runs
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run_id", "experiment", "status", "started", "duration", "ok", "error",
                                "running", "planned", "tokens_in", "tokens_out", "models", "settings", "hash"]
    assert len(lines) == 5 and lines[-1] == "(2 rows)"
    r1 = lines[2].split()
    assert r1[0] == w1.run_id and r1[1:3] == ["ask_e", "finished"] and r1[-1] == "f00dfeedf00d"
    runs = list_runs(out)
    assert [r["run_id"] for r in runs] == [w1.run_id, w2.run_id]
    assert (runs[0]["ok"], runs[0]["error"], runs[0]["planned_sessions"]) == (2, 1, 4)
    assert (runs[1]["ok"], runs[1]["error"], runs[1]["running"]) == (0, 0, 1)
    assert list_runs(w1.run_dir)[0]["run_id"] == w1.run_id
    w2.close()

    (tmp_path / "empty").mkdir()
    assert cli("runs", tmp_path / "empty") == 0
    assert "no runs" in capsys.readouterr().out
    assert list_runs(tmp_path / "empty") == []


def test_export(finished_run, tmp_path, capsys):
    dest = tmp_path / "export"
    assert cli("export", finished_run, "--parquet", dest) == 0
    assert "turns.parquet: 8 rows" in capsys.readouterr().out
    names = sorted(p.name for p in dest.iterdir())
    assert names == sorted(f"{v}.parquet" for v in
                           ["runs", "sessions", "turns", "rewards", "groups", "matches", "train_steps", "buffer_events",
                                "buffer_items", "nested_events", "rollouts"])
    assert pq.read_table(dest / "sessions.parquet").num_rows == 4
    assert pq.read_table(dest / "turns.parquet").column("session_id").to_pylist()[0].startswith("s")


@pytest.mark.parametrize("dest", ["{run}/events", "{run}", "{run}/events/overflow", "{run}/spec/new",
                                  "{link}/events", "{other}/events"])
def test_export_into_a_run_is_refused(kit, finished_run, tmp_path, capsys, dest):
    """An export into a run's own folders would overwrite its compacted copies
    (events/<name>.parquet): refused before anything is written, the runs intact."""
    from askspec.runtime.store.compact import compact_run

    compact_run(finished_run)
    other = kit.new_writer(tmp_path / "others")
    kit.play_session(other, 0)
    other.finish("finished")
    (tmp_path / "link").symlink_to(finished_run, target_is_directory=True)
    dest = dest.format(run=finished_run, link=tmp_path / "link", other=other.run_dir)
    runs = {r: {p: p.read_bytes() for p in sorted(r.rglob("*")) if p.is_file()}
            for r in (finished_run, other.run_dir)}
    before = query(finished_run, "SELECT * FROM turns ORDER BY session_id, turn_index").to_pylist()
    rc = cli("export", finished_run, "--parquet", dest)
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"error: export --parquet {dest}: that folder is inside run ")
    assert "nothing was written" in err
    assert {r: {p: p.read_bytes() for p in sorted(r.rglob("*")) if p.is_file()} for r in runs} == runs
    assert query(finished_run, "SELECT * FROM turns ORDER BY session_id, turn_index").to_pylist() == before


def test_compact_command(kit, finished_run, tmp_path, capsys):
    assert cli("compact", finished_run) == 0
    assert "events/turns.parquet: 8 rows" in capsys.readouterr().out
    assert layout.parquet_path(finished_run, "turns").exists()
    w = kit.new_writer(tmp_path / "live")
    assert_one_line_error(capsys, cli("compact", w.run_dir), "still running")
    w.close()


@pytest.mark.parametrize("argv, match", [
    (["query", "{missing}", "SELECT 1"], "no such directory"),
    (["query", "{tmp}", "SELECT 1"], "not a run directory"),
    (["query", "{run}", "SELECT * FROM nope"], "Catalog Error"),
    (["query", "{run}", "SELEC 1"], "Parser Error"),
    (["query", "{run}", "SELECT 1/'a'"], "error"),
    (["runs", "{missing}"], "no such directory"),
    (["export", "{missing}", "--parquet", "{tmp}/x"], "no such directory"),
    (["compact", "{missing}"], "not a run directory"),
    (["compact", "{tmp}"], "not a run directory"),
])
def test_error_paths(finished_run, tmp_path, capsys, argv, match):
    subs = {"missing": tmp_path / "missing", "tmp": tmp_path / "plain", "run": finished_run}
    (tmp_path / "plain").mkdir()
    argv = [a.format(**subs) for a in argv]
    assert_one_line_error(capsys, cli(*argv), match)


def test_format_table_edge_cases():
    assert format_table(pa.table({})) == "(no result)"
    t = pa.table({"a": pa.array([], pa.int64())})
    assert format_table(t).splitlines() == ["a", "-", "(0 rows)"]
    t = pa.table({"s": ["x\ty\nz"], "f": [float("nan")], "n": [None]})
    lines = format_table(t).splitlines()
    assert lines[2].split() == ["x\\ty\\nz", "nan", "NULL"] and lines[-1] == "(1 row)"
