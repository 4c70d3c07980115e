"""What the store commands print: no terminal control sequences from model text in
tables and errors; CSV with plain ``\\n`` line ends (shell pipelines)."""

from __future__ import annotations

import argparse
import csv
import io

import pyarrow as pa

from askspec.runtime.commands.query import _write_csv, format_table, register
from askspec.runtime.commands.runs import register as register_runs

ESC_TEXT = "ok\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eevil\r\nnext"


def cli(*argv):
    parser = argparse.ArgumentParser(prog="askspec")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    register_runs(sub)  # `runs` lives in runs.py
    args = parser.parse_args([str(a) for a in argv])
    return args.func(args)


def assert_no_controls(text: str) -> None:
    for ch in "\x1b\x07\x9b\u202e\r":
        assert ch not in text, repr(text)


def test_query_table_escapes_model_text(kit, tmp_path, capsys):
    w = kit.new_writer(tmp_path / "runs")
    sid = "s0"
    attempt = w.session_started(sid, game="g", group_id=None, params={}, index=0)
    w.turn(sid, attempt, turn_index=0, role="q", model="m", prompt=[], text=ESC_TEXT, parsed={},
           finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=1.0)
    w.session_finished(sid, attempt, status="ok", outcome=None, error=None, vars={})
    w.finish("finished")
    assert cli("query", w.run_dir, 'SELECT text AS "t\x1b[1m" FROM turns', "--max-width", "0") == 0
    out, err = capsys.readouterr()
    assert_no_controls(out)
    assert "ok\\e[2J\\e]0;pwned\\x07\\x9b31m\\u202eevil\\r\\nnext" in out
    assert out.splitlines()[0] == "t\\e[1m"
    # machine-facing output keeps the text exactly
    assert cli("query", w.run_dir, "SELECT text FROM turns", "--format", "csv") == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out, newline="")))
    assert rows[1] == [ESC_TEXT]


def test_error_lines_escape_sql_text(finished_run, capsys):
    assert cli("query", finished_run, "SELECT * FROM \"\x1b]0;pwned\x07\"") == 1
    out, err = capsys.readouterr()
    assert_no_controls(err)
    assert err.startswith("error: ") and err.count("\n") == 1


def test_runs_table_escapes_names(kit, tmp_path, capsys):
    w = kit.new_writer(tmp_path / "runs", experiment="x\x1b[31mred")
    w.finish("finished")
    assert cli("runs", tmp_path / "runs") == 0
    out = capsys.readouterr().out
    assert_no_controls(out)
    assert "x\\e[31mred" in out


def test_format_table_escapes_every_cell_and_header():
    t = pa.table({"a\x1b": [ESC_TEXT], "b": [["\x1b"]], "c": [{"k": "\x07"}]})
    text = format_table(t, max_width=0)
    assert_no_controls(text)
    assert len(text.splitlines()) == 4  # header, rule, one row, count


def test_csv_lines_end_in_newline_only(finished_run, capsys):
    assert cli("query", finished_run, "SELECT 1 AS a UNION ALL SELECT 3 ORDER BY 1", "--format", "csv") == 0
    out = capsys.readouterr().out
    assert out == "a\n1\n3\n"
    assert out.splitlines()[-1] == "3"  # what `| tail -1` sees


def test_csv_writer_used_by_metrics_has_no_crlf():
    buf = io.StringIO()
    _write_csv(pa.table({"metric": ["m", "n"], "value": [1.5, None]}), buf)
    assert buf.getvalue() == "metric,value\nm,1.5\nn,\n"
