"""`askspec query` and the TUI console: read-only, confined to the run store's own files.

Hostile statements are refused with one line and exit code 1, and nothing on disk
changes: not the run's event files, not files elsewhere."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from askspec.runtime.commands.query import query, register
from askspec.runtime.store import layout
from askspec.runtime.store.compact import compact_run
from askspec.runtime.store.readonly import QueryRefused, check_sql, open_readonly_store, run_readonly


def cli(*argv):
    parser = argparse.ArgumentParser(prog="askspec")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([str(a) for a in argv])
    return args.func(args)


def digest_tree(root):
    """Path -> sha256 of every file under ``root``: proof that nothing was written."""
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def secret(tmp_path):
    p = tmp_path / "secret.txt"
    p.write_text("name:password\nroot:hunter2\n")
    return p


# Statements that must never run; {run} is the run dir, {tmp} a folder outside it.
REFUSED = [
    "COPY (SELECT 1) TO '{tmp}/out.csv'",
    "COPY (SELECT 1 AS x) TO '{run}/events/sessions.ndjson'",
    "COPY (SELECT 1 AS x) TO '{run}/events/sessions.ndjson' (USE_TMP_FILE false, FORMAT json)",
    "COPY turns TO '{tmp}/turns.parquet'",
    "COPY turns FROM '{tmp}/in.csv'",
    "ATTACH '{tmp}/new.duckdb' AS x",
    "ATTACH ':memory:' AS x",
    "DETACH memory",
    "INSTALL httpfs",
    "LOAD httpfs",
    "LOAD json",
    "EXPORT DATABASE '{tmp}/export'",
    "IMPORT DATABASE '{tmp}/export'",
    "SET enable_external_access = true",
    "SET threads = 1",
    "SET VARIABLE x = 1",
    "RESET lock_configuration",
    "PRAGMA version",
    "PRAGMA enable_profiling",
    "CALL pragma_version()",
    "CHECKPOINT",
    "CREATE TABLE t AS SELECT 1",
    "CREATE VIEW v AS SELECT 1",
    "CREATE OR REPLACE VIEW turns AS SELECT 1",
    "CREATE MACRO m() AS 1",
    "CREATE SECRET s (TYPE s3)",
    "CREATE SCHEMA s",
    "CREATE TYPE e AS ENUM ('a')",
    "CREATE SEQUENCE q",
    "INSERT INTO turns VALUES (1)",
    "UPDATE turns SET text = ''",
    "DELETE FROM turns",
    "DROP VIEW turns",
    "ALTER VIEW turns RENAME TO t2",
    "COMMENT ON VIEW turns IS 'x'",
    "BEGIN TRANSACTION",
    "VACUUM",
    "ANALYZE",
    "USE memory",
    "PREPARE p AS SELECT 1",
    "UPDATE EXTENSIONS",
    "SELECT 1; UPDATE EXTENSIONS (httpfs)",
    "EXPLAIN (ANALYZE) COPY (SELECT 1) TO '{tmp}/out.csv'",
    "EXPLAIN (FORMAT json, ANALYZE) CREATE TABLE t AS SELECT 1",
    "WITH x AS (SELECT 1) INSERT INTO turns SELECT * FROM x",
    "DETACH DATABASE memory",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO '{tmp}/out.csv'",
    "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
    "EXPLAIN /* hi */ ANALYZE COPY (SELECT 1) TO '{run}/events/turns.ndjson' (USE_TMP_FILE false)",
    "SELECT * FROM (PIVOT (SELECT 'a' AS k) ON k)",  # creates a type first
    # more than one statement: all are checked before any runs
    "SELECT 1; COPY (SELECT 1) TO '{tmp}/out.csv'",
    "SELECT 1; COPY (SELECT 1 AS x) TO '{run}/events/turns.ndjson' (USE_TMP_FILE false); SELECT 2",
    "select 1;;ATTACH '{tmp}/new.duckdb'",
]


def fill(sql, run, tmp):
    return sql.format(run=run, tmp=tmp)


@pytest.mark.parametrize("sql", REFUSED)
def test_statement_refused_and_nothing_written(finished_run, tmp_path, capsys, sql):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "in.csv").write_text("a\n1\n")
    before, before_out = digest_tree(finished_run), digest_tree(outside)
    rc = cli("query", finished_run, fill(sql, finished_run, outside))
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "refused" in err and "read-only" in err
    assert digest_tree(finished_run) == before and digest_tree(outside) == before_out
    with pytest.raises(QueryRefused):
        query(finished_run, fill(sql, finished_run, outside))
    assert digest_tree(finished_run) == before and digest_tree(outside) == before_out


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('{secret}')",
    "SELECT * FROM read_csv_auto('{secret}', sep = ':')",
    "SELECT * FROM read_text('{secret}')",
    "SELECT * FROM read_blob('{secret}')",
    "SELECT * FROM read_json('{secret}')",
    "SELECT * FROM read_parquet('{secret}')",
    "SELECT * FROM parquet_metadata('{secret}')",
    "SELECT * FROM sniff_csv('{secret}')",
    "SELECT * FROM glob('{tmp}/*')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_text('{run}/../secret.txt')",
    "SELECT * FROM read_text('{run}/events/../../../secret.txt')",
    "SELECT * FROM '{secret}'",
    "SELECT * FROM read_parquet('https://example.com/x.parquet')",
    "SELECT * FROM query('SELECT * FROM read_text(''{secret}'')')",
])
def test_files_outside_the_store_are_unreadable(finished_run, tmp_path, secret, capsys, sql):
    sql = sql.format(secret=secret, tmp=tmp_path, run=finished_run)
    rc = cli("query", finished_run, sql)
    out, err = capsys.readouterr()
    assert rc == 1 and "hunter2" not in out + err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Permission Error" in err or "Catalog Error" in err


def test_environment_is_not_readable(finished_run, capsys, monkeypatch):
    monkeypatch.setenv("ASKSPEC_TEST_KEY", "sk-secret")
    assert cli("query", finished_run, "SELECT getenv('ASKSPEC_TEST_KEY')") == 1
    assert "sk-secret" not in capsys.readouterr().out


def test_python_variables_are_not_scanned(finished_run):
    import pyarrow as pa

    leaked = pa.table({"k": ["sk-secret"]})  # noqa: F841 - what a replacement scan would find
    store = open_readonly_store(finished_run)
    with pytest.raises(duckdb.Error):
        run_readonly(store.con, "SELECT * FROM leaked")


def test_connection_itself_is_locked(finished_run, secret):
    """The second lock: even SQL that skips ``check_sql`` cannot reach other files."""
    store = open_readonly_store(finished_run)
    con = store.con
    with pytest.raises(duckdb.PermissionException):
        con.execute(f"SELECT * FROM read_text('{secret}')")
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_external_access = true")
    with pytest.raises(duckdb.Error):
        con.execute("SET allowed_paths = ['/']")
    with pytest.raises(duckdb.Error):
        con.execute("RESET lock_configuration")
    with pytest.raises(duckdb.Error):
        con.execute("INSTALL httpfs")
    with pytest.raises(duckdb.Error):
        con.execute(f"ATTACH '{secret.parent}/x.duckdb'")
    assert not (secret.parent / "x.duckdb").exists()
    assert con.execute("SELECT count(*) FROM turns").fetchone() == (8,)


@pytest.mark.parametrize("sql, expected", [
    ("SELECT count(*) AS n FROM turns", [{"n": 8}]),
    ("select 1; SELECT count(*) AS n FROM sessions", [{"n": 4}]),
    ("WITH a AS (SELECT 2 AS n) SELECT * FROM a", [{"n": 2}]),
    ("FROM (VALUES (3)) t(n)", [{"n": 3}]),
    ("VALUES (4)", [{"col0": 4}]),
    ("SELECT count(*) AS n FROM train_steps -- trailing comment", [{"n": 2}]),
    ("PIVOT (SELECT 'a' AS k, 1 AS v) ON k IN ('a') USING sum(v)", [{"a": 1}]),
])
def test_queries_run(finished_run, sql, expected):
    assert query(finished_run, sql).to_pylist() == expected


@pytest.mark.parametrize("sql", [
    "DESCRIBE turns", "SHOW TABLES", "SUMMARIZE sessions", "EXPLAIN SELECT * FROM turns",
    "EXPLAIN ANALYZE SELECT count(*) FROM turns", "EXPLAIN (SELECT 1)",
    "EXPLAIN (FORMAT json) SELECT 1", "explain /* c */ analyze select 1",
])
def test_introspection_runs(finished_run, sql):
    assert query(finished_run, sql).num_rows > 0


def test_run_readonly_checks_everything_first(finished_run, tmp_path):
    store = open_readonly_store(finished_run)
    with pytest.raises(QueryRefused, match="statement 2 of 3"):
        check_sql(store.con, f"SELECT 1; ATTACH '{tmp_path}/a.duckdb'; SELECT 2")
    with pytest.raises(QueryRefused, match="no SQL statement"):
        check_sql(store.con, " ; -- nothing")
    with pytest.raises(duckdb.ParserException):
        check_sql(store.con, "SELEC 1")


def test_views_read_parquet_and_runs_in_a_folder(kit, tmp_path):
    """Files read through the views stay readable after locking: NDJSON, Parquet copies,
    and several runs under one folder."""
    out = tmp_path / "runs"
    w1 = kit.new_writer(out, experiment="a")
    for i in range(3):
        kit.play_session(w1, i)
    w1.finish("finished")
    w2 = kit.new_writer(out, experiment="b")
    kit.play_session(w2, 0)
    w2.finish("finished")
    compact_run(w1.run_dir)
    assert layout.parquet_path(w1.run_dir, "turns").exists()
    t = query(out, "SELECT run_id, count(*) AS n FROM turns GROUP BY ALL ORDER BY n")
    assert t.column("n").to_pylist() == [2, 6]
    assert query(out, "SELECT count(*) AS n FROM runs").to_pylist() == [{"n": 2}]
    # the NDJSON of a compacted run is not among the readable files once Parquet stands in
    layout.ndjson_path(w1.run_dir, "turns").unlink()
    assert query(w1.run_dir, "SELECT count(*) AS n FROM turns").to_pylist() == [{"n": 6}]


def test_query_of_a_symlinked_run_dir(finished_run, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(finished_run, target_is_directory=True)
    assert query(link, "SELECT count(*) AS n FROM sessions").to_pylist() == [{"n": 4}]


def test_a_runaway_query_is_interrupted(finished_run, capsys):
    from askspec.runtime.store.readonly import QueryTimeout

    store = open_readonly_store(finished_run)
    with pytest.raises(QueryTimeout, match="interrupted after 0.5 s"):
        run_readonly(store.con, "SELECT count(*) FROM range(1000000000000000)", timeout=0.5)
    # the connection is still usable afterwards (the TUI keeps it)
    assert run_readonly(store.con, "SELECT count(*) AS n FROM turns", timeout=5)[0].to_pylist() == [{"n": 8}]
    assert cli("query", finished_run, "SELECT count(*) FROM range(1000000000000000)", "--timeout", "0.5") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: query interrupted after 0.5 s") and err.count("\n") == 1


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "x"])
def test_bad_timeout_is_a_usage_error(finished_run, capsys, value):
    with pytest.raises(SystemExit) as info:
        cli("query", finished_run, "SELECT 1", "--timeout", value)
    assert info.value.code == 2 and "seconds" in capsys.readouterr().err


def test_cursors_of_a_locked_store_stay_locked(finished_run, secret):
    """The TUI takes a cursor per worker thread: each is as confined as the connection."""
    import threading

    store = open_readonly_store(finished_run)
    results = []

    def worker():
        cur = store.con.cursor()
        try:
            cur.execute(f"SELECT * FROM read_text('{secret}')")
            results.append("read")
        except duckdb.PermissionException:
            results.append("refused")
        with pytest.raises(QueryRefused):
            run_readonly(cur, "CREATE TABLE t AS SELECT 1")
        results.append(run_readonly(cur, "SELECT count(*) AS n FROM sessions")[0].to_pylist())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert results == ["refused", [{"n": 4}]]


# -------------------------------------------------- files planted in a run (issue #25)

ROOT = Path(__file__).resolve().parents[2]


def plant_link(run, rel, target):
    path = run / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    path.symlink_to(target)
    return path


@pytest.mark.parametrize("rel", ["events/overflow/leak.txt", "events/turns.ndjson", "events/sessions.parquet"])
def test_a_planted_symlink_is_not_read(finished_run, tmp_path, secret, capsys, rel):
    """A link to a file outside the run, where the views or read_text() would read it."""
    outside = tmp_path / "outside.ndjson"  # a turns file of its own: the views would show it
    outside.write_text(layout.ndjson_path(finished_run, "turns").read_text().replace("what is", "hunter2"))
    link = plant_link(finished_run, rel, secret if rel.endswith(".txt") else outside)
    for sql in (f"SELECT * FROM read_text('{link}')", f"SELECT * FROM read_blob('{link}')",
                "SELECT text FROM turns", "SELECT * FROM sessions"):
        rc = cli("query", finished_run, sql, "--max-width", "0")
        out, err = capsys.readouterr()
        assert "hunter2" not in out + err, sql
        assert f"{rel} is a symbolic link (to {os.path.realpath(link)}): not read" in err
        assert rc == (1 if "read_" in sql else 0), err
    with pytest.raises(duckdb.PermissionException):
        query(finished_run, f"SELECT * FROM read_text('{link}')")


def test_a_link_to_a_file_of_the_run_itself_is_refused_too(finished_run, capsys):
    """One rule for every link (a link inside can be retargeted between check and read)."""
    plant_link(finished_run, "events/overflow/inside.txt", finished_run / "manifest.json")
    assert cli("query", finished_run, "SELECT count(*) AS n FROM turns") == 0
    assert "events/overflow/inside.txt is a symbolic link" in capsys.readouterr().err


def test_a_linked_overflow_folder_is_not_read(finished_run, tmp_path, secret, capsys):
    ev = layout.events_dir(finished_run)
    (ev / "overflow").mkdir(exist_ok=True)
    (ev / "overflow").rmdir()
    (ev / "overflow").symlink_to(tmp_path, target_is_directory=True)  # holds secret.txt
    rc = cli("query", finished_run, f"SELECT * FROM read_text('{ev}/overflow/secret.txt')")
    out, err = capsys.readouterr()
    assert rc == 1 and "hunter2" not in out + err
    assert "events/overflow/secret.txt leads through a symbolically linked folder" in err


def test_a_linked_manifest_skips_the_run(finished_run, tmp_path, capsys):
    moved = tmp_path / "manifest.json"
    (finished_run / "manifest.json").rename(moved)
    plant_link(finished_run, "manifest.json", moved)
    assert cli("query", finished_run, "SELECT * FROM runs") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read run: ") and "manifest.json is a symbolic link" in err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rel", ["events/overflow/pipe.txt", "events/compaction.json", "events/turns.ndjson",
                                 "events/sessions.parquet", "rollouts/step-000001.parquet"])
def test_a_planted_fifo_never_blocks(finished_run, rel):
    """Opening a FIFO blocks until someone writes to it; no reader ever opens one. In a
    subprocess, so that a regression hangs that process, not the test run."""
    path = finished_run / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    for sql in ("SELECT count(*) AS n FROM sessions", f"SELECT * FROM read_text('{path}')"):
        done = subprocess.run([sys.executable, "-m", "askspec.cli", "query", str(finished_run), sql,
                               "--timeout", "5"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert f"{rel} is a FIFO (named pipe), not a regular file: not read" in done.stderr or \
            rel == "events/compaction.json", done.stderr
        assert done.returncode == (0 if "count" in sql else 1), done.stderr
    assert done.stderr.count("error: ") == 1 and "Traceback" not in done.stderr


@pytest.mark.timeout(60)
def test_a_read_that_blocks_after_the_checks_is_abandoned_at_the_time_limit(finished_run):
    """A file swapped for a FIFO after the store was opened: DuckDB's interrupt cannot
    reach a blocked open(), so the watchdog gives up on the query at its time limit."""
    from askspec.runtime.store.readonly import STUCK_GRACE, QueryTimeout

    side = layout.events_dir(finished_run) / "overflow" / "late.txt"
    side.parent.mkdir(exist_ok=True)
    side.write_text("x")
    store = open_readonly_store(finished_run)
    side.unlink()
    os.mkfifo(side)
    start = time.monotonic()
    with pytest.raises(QueryTimeout, match="did not stop, so it was abandoned"):
        run_readonly(store.con, f"SELECT * FROM read_text('{side}')", timeout=0.3)
    assert time.monotonic() - start < 0.3 + STUCK_GRACE + 2
    # unblock the abandoned query (a writer opens the pipe and closes it: end of file)
    os.close(os.open(side, os.O_WRONLY))
    assert run_readonly(store.con.cursor(), "SELECT count(*) AS n FROM turns", timeout=5).table.num_rows == 1


# ------------------------------------------------------------ memory and result size

def test_a_result_is_cut_at_the_row_limit(finished_run, capsys):
    # a streaming result stops being computed at the cut: range(1e12) returns at once
    assert cli("query", finished_run, "SELECT * FROM range(1000000000000)", "--limit", "3", "--timeout", "30") == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "(3 rows)"
    assert err == ("warning: result cut: only the first 3 rows are shown (the row limit); --limit ROWS and "
                   "--max-cell CHARS change the limits (0: none)\n")
    assert cli("query", finished_run, "SELECT * FROM range(5000)", "--limit", "0", "--format", "csv") == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 5001 and err == ""
    assert cli("query", finished_run, "SELECT * FROM range(3)", "--limit", "3") == 0
    assert capsys.readouterr().err == ""  # exactly the limit: nothing cut


def test_a_huge_cell_is_cut_before_it_is_fetched(finished_run, capsys):
    assert cli("query", finished_run, "SELECT repeat('é', 50) AS s, '{\"a\": 1}'::JSON AS j, 7 AS n, "
               "repeat('x', 20) AS s", "--max-cell", "10", "--format", "json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [{"s": "x" * 10, "j": {"a": 1}, "n": 7}] or \
        json.loads(out) == [{"s": "é" * 10, "j": {"a": 1}, "n": 7}]  # two columns named s
    assert "2 text cells longer than 10 characters cut to that length" in err


def test_result_limits_in_rows_bytes_and_cells():
    from askspec.runtime.store.readonly import Limits

    con = duckdb.connect(":memory:")
    sql = "SELECT range AS i, repeat('y', 100) AS s FROM range(10000)"
    r = run_readonly(con, sql, limits=Limits(rows=2500))
    assert (r.table.num_rows, r.rows) == (2500, None) and "first 2,500 rows" in r.cut
    r = run_readonly(con, sql, limits=Limits(rows=2500, count=True))
    assert (r.table.num_rows, r.rows) == (2500, 10000)
    r = run_readonly(con, sql, timeout=10, limits=Limits(rows=None, bytes=200_000))
    assert 0 < r.table.num_rows < 10000 and r.table.nbytes <= 200_000 and "the size limit" in r.cut
    r = run_readonly(con, sql, limits=Limits(rows=None, bytes=None, cell_chars=5))
    assert r.table.column("s")[0].as_py() == "yyyyy" and r.cut.startswith("10,000 text cells")
    r = run_readonly(con, sql, limits=Limits(None, None, None))
    assert (r.table.num_rows, r.cut, r.rows) == (10000, None, 10000)


def test_queries_run_under_a_memory_limit(finished_run, capsys):
    from askspec.runtime.store.readonly import MEMORY_LIMIT

    assert query(finished_run, "SELECT current_setting('memory_limit') AS m").to_pylist() != [{"m": ""}]
    assert MEMORY_LIMIT == "1024MiB"  # whatever the machine (readonly.py)
    assert cli("query", finished_run, "SELECT current_setting('memory_limit') AS m", "--memory-limit", "300MB",
               "--format", "csv") == 0
    assert capsys.readouterr().out.splitlines()[1] in ("286.1 MiB", "300.0 MB")
    # work past the limit fails (one line) instead of growing
    rc = cli("query", finished_run, "SELECT count(*) FROM (SELECT range FROM range(20000000) ORDER BY random())",
             "--memory-limit", "20MB")
    out, err = capsys.readouterr()
    assert rc == 1 and err.startswith("error: Out of Memory Error") and err.count("\n") == 1, err
    rc = cli("query", finished_run, "SELECT 1", "--memory-limit", "lots")
    out, err = capsys.readouterr()
    assert rc == 1 and "Memory must have a number (e.g. 1GB)" in err and err.count("\n") == 1, err


def test_text_built_in_a_query_is_held_to_the_memory_limit(finished_run, capsys):
    """DuckDB's memory_limit does not count the text a string function builds
    (repeat('x', 8e8) took 1.6 GB under a 100 MB limit): while a query runs the process
    may grow by the limit and the result's size limit, no more, and past it the query
    fails with one line naming the limit; the process's own limit is put back after."""
    import resource

    before = resource.getrlimit(resource.RLIMIT_DATA)
    rc = cli("query", finished_run, "SELECT repeat('x', 800000000) AS s", "--memory-limit", "100MB",
             "--timeout", "60")
    out, err = capsys.readouterr()
    assert rc == 1 and out == "", out[:200]
    assert err.startswith("error: Out of Memory Error") and err.count("\n") == 1, err
    assert err.rstrip().endswith("(the query's memory limit is 95.3 MiB); --memory-limit SIZE gives it more"), err
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert cli("query", finished_run, "SELECT length(repeat('x', 1000000)) AS n", "--memory-limit", "100MB") == 0
    assert capsys.readouterr().out.splitlines()[2].strip() == "1000000"


def test_the_size_limit_holds_for_the_first_rows_too():
    """A result's first batch of rows (1,024) was kept whole whatever its size: it is
    cut to the rows within the size limit, and a first row past it alone is refused."""
    from askspec.runtime.store.readonly import Limits, QueryTooLarge

    con = duckdb.connect(":memory:")
    r = run_readonly(con, "SELECT repeat('y', 100) AS s FROM range(100)", limits=Limits(None, 2000, None))
    assert 0 < r.table.num_rows < 100 and r.table.nbytes <= 2000 and "the size limit" in r.cut
    with pytest.raises(QueryTooLarge, match=r"the result's first row is 4.89 KiB, past the size limit of 1.95 KiB"):
        run_readonly(con, "SELECT repeat('y', 5000) AS s", limits=Limits(None, 2000, None))


def test_the_cli_refuses_a_first_row_past_the_size_limit(finished_run, capsys, monkeypatch):
    from askspec.runtime.commands import query as query_cmd
    from askspec.runtime.store.readonly import Limits

    monkeypatch.setattr(query_cmd, "QUERY_LIMITS", Limits(bytes=1 << 20))
    assert cli("query", finished_run, "SELECT repeat('y', 3000000) AS s", "--max-cell", "0") == 1
    err = capsys.readouterr().err
    assert err == ("error: the result's first row is 2.86 MiB, past the size limit of 1 MiB: select less of it "
                   "(left(text, N), fewer columns); --limit ROWS changes the size limit with the row limit "
                   "(0: none)\n")


def test_the_tui_console_is_held_to_the_memory_limit(finished_run, monkeypatch):
    from askspec.runtime.store import readonly
    from askspec.tui import data, source as tui_source

    # (room for a scan of the run's files after the refused query: a JSON scan's buffers take ~64 MiB)
    monkeypatch.setattr(tui_source, "_connect", lambda path: readonly.open_readonly_store(path, "200MB"))
    src = data.Source(finished_run)
    with pytest.raises(data.DataError, match=r"^Out of Memory Error.*\(the query's memory limit is 190.7 MiB\)$"):
        data.run_sql(src, "SELECT repeat('x', 400000000) AS s", 10)
    assert data.run_sql(src, "SELECT count(*) AS n FROM turns", 10)[0].to_pylist() == [{"n": 8}]


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_bad_limits_are_usage_errors(finished_run, capsys, value):
    for flag in ("--limit", "--max-cell"):
        with pytest.raises(SystemExit) as info:
            cli("query", finished_run, "SELECT 1", flag, value)
        assert info.value.code == 2 and "whole number" in capsys.readouterr().err


def test_the_tui_console_fetches_a_bounded_result(finished_run):
    """The console shows its first rows and counts the rest without keeping them; a
    huge cell is cut inside DuckDB (the table shows one line of it)."""
    from askspec.tui import data

    source = data.Source(finished_run)
    table, total = data.run_sql(source, "SELECT * FROM range(250000)", 1000)
    assert (table.num_rows, total) == (1000, 250000)
    table, total = data.run_sql(source, "SELECT repeat('x', 100000) AS s", 1000)
    assert total == 1 and table.column("s")[0].as_py() == "x" * data.SQL_CELL_CHARS


@pytest.mark.timeout(60)
def test_the_tui_console_reports_an_abandoned_query(finished_run, monkeypatch):
    """The console's cursor stays busy with an abandoned query: closing it must not turn
    the time-limit message into a 'Resource In Use' one."""
    from askspec.tui import data

    side = layout.events_dir(finished_run) / "overflow" / "late.txt"
    side.parent.mkdir(exist_ok=True)
    side.write_text("x")
    source = data.Source(finished_run)
    assert data.run_sql(source, "SELECT count(*) AS n FROM turns", 10)[1] == 1  # the store is open
    side.unlink()
    os.mkfifo(side)
    monkeypatch.setattr(data, "SQL_TIMEOUT", 0.3)
    with pytest.raises(data.DataError, match="it did not stop, so it was abandoned"):
        data.run_sql(source, f"SELECT * FROM read_text('{side}')", 10)
    os.close(os.open(side, os.O_WRONLY))  # unblock the abandoned query
    assert data.run_sql(source, "SELECT count(*) AS n FROM turns", 10)[0].to_pylist() == [{"n": 8}]


def test_a_value_larger_than_the_default_memory_limit_is_refused_at_once(finished_run, capsys):
    """The hardening report's case: 2 GB built inside one query passed (the default limit
    was a quarter of the machine's memory); under the default 1 GiB it is one error line."""
    assert cli("query", finished_run, "SELECT repeat('x', 2000000000) AS s", "--timeout", "10") != 0
    err = capsys.readouterr().err
    assert "Out of Memory Error" in err and "--memory-limit" in err and "Traceback" not in err
