"""CLI subcommands over the run store: ``query``, ``export``, ``compact`` (``runs`` is in
runs.py, which uses this module's formatting).

``register(subparsers)`` adds them to an argparse subparsers object; each sets
``func`` to a handler ``(args) -> int``. Handlers print results to stdout,
store warnings as ``warning: ...`` and failures as one ``error: ...`` line to
stderr (exit code 1), never a traceback. The pure function ``query`` (and
``runs.list_runs``) is for the TUI and metrics code.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

import duckdb
import pyarrow as pa

from askspec.argtypes import seconds, whole_number
from askspec.terminal import os_error, printable

from askspec.runtime.store import layout
from askspec.runtime.store.compact import CompactError, compact_run
from askspec.runtime.store.readonly import (MEMORY_LIMIT, Limits, QueryRefused, QueryTimeout, QueryTooLarge,
                                             open_readonly_store, run_readonly)
from askspec.runtime.store.views import VIEW_NAMES, Store, StoreError, connect, one_row

QUERY_TIMEOUT = 600.0  # seconds; a query over a large run takes seconds, not minutes
QUERY_LIMITS = Limits()  # rows, bytes and characters a cell that `askspec query` prints

# ---------------------------------------------------------------------- pure API


def query(path: str | os.PathLike[str], sql: str, limits: Limits = Limits(None, None, None)) -> pa.Table:
    """Run ``sql`` against the store views of ``path`` (run dir or folder of runs).

    Read-only and confined (see ``store.readonly``): only queries run, and only the
    run's own files are readable. Raises ``QueryRefused`` for any other statement. The
    whole result unless ``limits`` says otherwise (``QUERY_LIMITS``: the CLI's).
    """
    store = open_readonly_store(path)
    try:
        return run_readonly(store.con, sql, limits=limits).table
    finally:
        store.con.close()


# ---------------------------------------------------------------------- formatting


def _cell(value: Any, max_width: int) -> str:
    if value is None:
        text = "NULL"
    elif isinstance(value, float):
        text = "nan" if math.isnan(value) else f"{value:.6g}"
    elif isinstance(value, _dt.datetime):
        text = value.isoformat(sep=" ", timespec="seconds")
    elif isinstance(value, (list, dict)):
        text = json.dumps(value, ensure_ascii=False, default=str)
    else:
        text = str(value)
    # One row per line, and model text must not drive the terminal: escape controls.
    text = printable(text, single_line=True)
    if max_width > 0 and len(text) > max_width:
        text = text[: max(1, max_width - 1)] + "…"
    return text


def format_table(table: pa.Table, max_width: int = 40) -> str:
    """An aligned text table with a header, numbers right-aligned, long cells cut."""
    names = table.column_names
    if not names:
        return "(no result)"
    numeric = [
        pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
        for f in table.schema
    ]
    header = [printable(n, single_line=True) for n in names]
    rows = [[_cell(v, max_width) for v in row.values()] for row in table.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)
        ).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    n = table.num_rows
    out.append(f"({n} row{'s' if n != 1 else ''})")
    return "\n".join(out)


def _write_csv(table: pa.Table, out: TextIO) -> None:
    w = csv.writer(out, lineterminator="\n")  # not the csv module's \r\n: shell pipelines split on \n
    w.writerow(table.column_names)
    for row in table.to_pylist():
        w.writerow(["" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else v
                    for v in row.values()])


def _json_rows(table: pa.Table, types: list[str]) -> list[dict]:
    # JSON-typed columns arrive as strings; embed them as JSON, not as quoted text.
    json_cols = {n for n, t in zip(table.column_names, types) if t == "JSON"}
    rows = table.to_pylist()
    for row in rows:
        for c in json_cols:
            if row[c] is not None:
                try:
                    row[c] = json.loads(row[c])
                except ValueError:
                    pass
    return rows


def _write_json(table: pa.Table, types: list[str], out: TextIO) -> None:
    json.dump(_json_rows(table, types), out, ensure_ascii=False, indent=2, default=_json_default)
    out.write("\n")


def _write_jsonl(table: pa.Table, types: list[str], out: TextIO) -> None:
    """One JSON object per line: a data set a spec's `jsonl(...)` reads (e.g. the items
    specs/askbench_build.ask builds, exported for specs/askbench.ask)."""
    for row in _json_rows(table, types):
        out.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")


def _json_default(v: Any) -> Any:
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


# ---------------------------------------------------------------------- handlers


def _error(message: str) -> int:
    # messages quote user SQL and file names: no control characters reach the terminal
    print(f"error: {printable(message, single_line=True)}", file=sys.stderr)
    return 1


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _print_warnings(store: Store) -> None:
    for _category, message in store.warnings:
        print(f"warning: {message}", file=sys.stderr)


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn any failure of ``handler`` into one ``error:`` line and exit code 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except BrokenPipeError:
            # Output piped into `head` and closed early: not an error worth a message.
            # Point stdout at devnull so the interpreter's final flush stays quiet.
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass
            return 0  # as the askspec CLI does for a closed pipe
        except QueryTooLarge as e:
            hint = ("--memory-limit SIZE gives it more" if str(e).startswith("Out of Memory Error")
                    else "--limit ROWS changes the size limit with the row limit (0: none)")
            return _error(f"{e}; {hint}")
        except (StoreError, CompactError, QueryRefused, QueryTimeout) as e:
            return _error(str(e))
        except duckdb.PermissionException as e:
            return _error(f"{_first_line(e)} (a query reads only the run store's own files)")
        except duckdb.Error as e:
            return _error(_first_line(e))
        except OSError as e:
            return _error(os_error(e) if e.filename else _first_line(e))
        except KeyboardInterrupt:
            return _error("interrupted")
        except Exception as e:  # the CLI promises no tracebacks
            return _error(f"{type(e).__name__}: {_first_line(e)}")

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


@_guarded
def cmd_query(args: argparse.Namespace) -> int:
    """askspec query RUN_DIR "SQL" [--format table|csv|json|jsonl] [--max-width N] [--timeout SECONDS]
    [--limit ROWS] [--max-cell CHARS] [--memory-limit SIZE]"""
    # programmatic callers may build args without the newer flags: their defaults apply
    store = open_readonly_store(args.run_dir, getattr(args, "memory_limit", MEMORY_LIMIT))
    _print_warnings(store)
    rows = getattr(args, "limit", QUERY_LIMITS.rows)
    cell = getattr(args, "max_cell", QUERY_LIMITS.cell_chars)
    limits = Limits(rows or None, QUERY_LIMITS.bytes if rows else None, cell or None)
    try:
        table, types, cut, _rows = run_readonly(store.con, args.sql, getattr(args, "timeout", QUERY_TIMEOUT) or None,
                                                limits)
    finally:
        try:
            store.con.close()
        except duckdb.Error:  # still busy with a query the watchdog gave up on: the process ends it
            pass
    if args.format == "csv":
        _write_csv(table, sys.stdout)
    elif args.format == "json":
        _write_json(table, types, sys.stdout)
    elif args.format == "jsonl":
        _write_jsonl(table, types, sys.stdout)
    else:
        print(format_table(table, args.max_width))
    if cut:
        print(f"warning: result cut: {cut}; --limit ROWS and --max-cell CHARS change the limits "
              "(0: none)", file=sys.stderr)
    return 0


@_guarded
def cmd_export(args: argparse.Namespace) -> int:
    """askspec export RUN_DIR --parquet OUT: one Parquet file per view; --inspect DIR: one
    Inspect eval log per game (inspect_log.py)."""
    inspect_dir = getattr(args, "inspect", None)
    if (args.parquet is None) == (inspect_dir is None):
        return _error("export needs one of --parquet OUT (every view as Parquet) or --inspect DIR (Inspect logs)")
    flag, target_dir = ("--parquet", args.parquet) if args.parquet is not None else ("--inspect", inspect_dir)
    assert target_dir is not None  # one of the two, checked above
    if inspect_dir is not None:  # before the store opens: no extra, nothing read
        from askspec.runtime.commands.inspect_log import MISSING

        try:
            import inspect_ai.log  # noqa: F401
        except ImportError:
            return _error(MISSING)
    store = connect(args.run_dir)
    out = Path(target_dir)
    inside = _inside_a_run(out, store.run_dirs)
    if inside is not None:
        store.con.close()
        return _error(f"export {flag} {out}: that folder is inside run {inside}, whose own files an export "
                      "would overwrite (events/<name>.parquet are its compacted copies); nothing was written. "
                      "Give a folder outside every run, e.g. exports/<run-id>")
    _print_warnings(store)
    if inspect_dir is not None:
        return _export_inspect(store, out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for view in VIEW_NAMES:
            target = out / f"{view}.parquet"
            tmp = out / f".{view}.parquet.{os.getpid()}.tmp"
            path = os.fspath(tmp.resolve()).replace("'", "''")
            try:
                (count,) = one_row(store.con,
                                   f"COPY (SELECT * FROM {view}) TO '{path}' (FORMAT parquet, COMPRESSION zstd)")
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            print(f"{target}: {count} rows")
    finally:
        store.con.close()
    return 0


def _export_inspect(store: Store, out: Path) -> int:
    from askspec.runtime.commands.inspect_log import export_inspect

    try:
        if len(store.run_dirs) != 1:
            return _error(f"export --inspect takes one run directory; {len(store.run_dirs)} runs were found there")
        for path, n in export_inspect(store, out):
            print(f"{path}: {n} sample{'s' if n != 1 else ''}")
    finally:
        store.con.close()
    return 0


def _inside_a_run(out: Path, run_dirs: list[Path]) -> Path | None:
    """The run directory ``out`` is (or lies inside) once resolved, else None: one of
    ``run_dirs`` (resolved), or any folder above ``out`` that is a run directory."""
    real = Path(os.path.realpath(out))
    for rd in run_dirs:
        if real == rd or rd in real.parents:
            return rd
    for folder in (real, *real.parents):
        if layout.is_run_dir(folder):
            return folder
    return None


@_guarded
def cmd_compact(args: argparse.Namespace) -> int:
    """askspec compact RUN_DIR [--force]: Parquet copies of the event files."""
    rows = compact_run(args.run_dir, force=args.force)
    for name, n in rows.items():
        print(f"events/{name}.parquet: {n} rows")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``query``, ``export`` and ``compact`` to an argparse subparsers object (``runs``
    is runs.register)."""
    p = subparsers.add_parser(
        "query",
        help="run SQL over a run's views",
        description="Run SQL against the views runs, sessions, turns, rewards, groups, matches, "
        "train_steps of a run directory or a folder of runs (safe while the run is writing).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory or a folder of runs")
    p.add_argument("sql", metavar="SQL")
    p.add_argument("--format", choices=("table", "csv", "json", "jsonl"), default="table",
                   help="jsonl: one object per row, JSON columns as JSON (a data set a spec can read)")
    p.add_argument("--max-width", type=int, default=40, metavar="N",
                   help="cut table cells to N characters (0: no limit; default 40)")
    p.add_argument("--timeout", type=seconds, default=QUERY_TIMEOUT, metavar="SECONDS",
                   help=f"interrupt a query still running after SECONDS (0: never; default {QUERY_TIMEOUT:g})")
    p.add_argument("--limit", type=whole_number, default=QUERY_LIMITS.rows, metavar="ROWS",
                   help=f"print at most ROWS rows and {(QUERY_LIMITS.bytes or 0) >> 20} MiB of the result, "
                        f"saying so when it is cut (0: no limit, the whole result held in memory; "
                        f"default {QUERY_LIMITS.rows})")
    p.add_argument("--max-cell", type=whole_number, default=QUERY_LIMITS.cell_chars, metavar="CHARS",
                   help=f"cut a text cell to CHARS characters before it is fetched, in every format "
                        f"(0: no limit; default {QUERY_LIMITS.cell_chars})")
    p.add_argument("--memory-limit", default=MEMORY_LIMIT, metavar="SIZE",
                   help=f"memory DuckDB may use for the query, e.g. 4GB (default {MEMORY_LIMIT}); "
                        "one that needs more fails with an Out of Memory Error")
    p.set_defaults(func=cmd_query)


    p = subparsers.add_parser("export", help="write every view of a run to Parquet, or the run as Inspect logs")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--parquet", metavar="OUT", help="output folder (created): one Parquet file per view")
    p.add_argument("--inspect", metavar="DIR",
                   help="output folder (created): one Inspect .eval log per game, a sample per session "
                        "(needs the extra: pip install 'askspec[inspect]')")
    p.set_defaults(func=cmd_export)

    p = subparsers.add_parser("compact", help="add Parquet copies of a finished run's event files")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--force", action="store_true",
                   help="compact even if the manifest says running (its process must be gone)")
    p.set_defaults(func=cmd_compact)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m askspec.runtime.commands.query``)."""
    parser = argparse.ArgumentParser(prog="askspec")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
