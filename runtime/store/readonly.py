"""Read-only, confined SQL over a run store: what ``askspec query`` and the TUI's SQL
console run.

A query is user input, and DuckDB SQL is a programming language: it reads any file
(``read_csv('/etc/passwd')``), writes any file (``COPY ... TO``, ``ATTACH``,
``EXPORT DATABASE``), installs extensions and changes its own settings. Two locks,
each sufficient against a different half of that:

1. The connection. ``open_readonly_store`` defines the views (``views.connect``), then
   allows file access only to the exact files those views read (``allowed_paths``),
   turns ``enable_external_access`` off (no other file, no network, no extension
   install or load, no ``ATTACH`` of a file), turns off extension autoloading and
   Python replacement scans, and locks the configuration so no ``SET`` undoes it.
2. The statements. The files the views read are themselves reachable, and DuckDB
   grants write access wherever it grants read access (``COPY (...) TO
   'RUN/events/turns.ndjson' (USE_TMP_FILE false)`` would truncate the run's events),
   so ``check_sql`` admits only queries: ``SELECT`` (``WITH``, ``VALUES``, ``FROM``,
   ``DESCRIBE``, ``SHOW``, ``SUMMARIZE`` parse as SELECT) and ``EXPLAIN [ANALYZE]`` of
   one. Everything else (COPY, ATTACH, INSTALL, LOAD, EXPORT, SET, RESET, PRAGMA, CALL,
   CREATE, INSERT, UPDATE, DELETE, DROP, ALTER, transactions, ...) is refused before
   anything in the text runs, whichever position it has among several statements.

Usage (the TUI does the same)::

    store = open_readonly_store(run_dir)       # or a folder of runs
    table, types = run_readonly(store.con, sql, timeout=60)
    # QueryRefused, QueryTimeout or duckdb.Error (one line each) on failure
"""

from __future__ import annotations

import os
import threading

import duckdb
import pyarrow as pa

from askspec.runtime.store.views import Store, connect


class QueryRefused(Exception):
    """A statement that a read-only store does not run (the message is one line)."""


_ALLOWED = {duckdb.StatementType.SELECT}
_EXPLAIN = duckdb.StatementType.EXPLAIN

_KIND_NAMES = {
    "VARIABLE_SET": "SET VARIABLE",
    "CREATE_FUNC": "CREATE FUNCTION",
    "COPY_DATABASE": "COPY DATABASE",
    "MERGE_INTO": "MERGE INTO",
    "MULTI": "a statement that creates objects (e.g. PIVOT without IN)",
    "LOAD": "INSTALL/LOAD",
    "VACUUM": "VACUUM/ANALYZE",
    "TRANSACTION": "a transaction statement",
}


def _lock(con: duckdb.DuckDBPyConnection, files: list[str]) -> None:
    """Confine ``con`` to reading ``files``; irreversible for this connection."""
    quoted = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    con.execute(f"SET allowed_paths = [{quoted}]")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET python_enable_replacements = false")  # no scans of the caller's variables
    con.execute("SET enable_external_access = false")  # can never be turned back on
    con.execute("SET lock_configuration = true")


def open_readonly_store(path: str | os.PathLike[str]) -> Store:
    """The store views over ``path`` (a run dir or a folder of runs) on a locked connection.

    Raises ``StoreError`` when ``path`` holds no run. Use ``run_readonly`` (not
    ``con.sql``) to run user SQL on it: the connection lock alone does not stop a write
    to the run's own event files.
    """
    store = connect(path)
    try:
        _lock(store.con, [os.fspath(p) for p in store.files])
    except BaseException:
        store.con.close()
        raise
    return store


def _kind(t: duckdb.StatementType) -> str:
    name = t.name
    return _KIND_NAMES.get(name, name)


def _explained(stmt_text: str, con: duckdb.DuckDBPyConnection) -> bool:
    """Whether an EXPLAIN statement explains a query (EXPLAIN ANALYZE runs it)."""
    data = stmt_text.encode("utf-8")  # token positions are byte offsets
    tokens = [pos for pos, kind in duckdb.tokenize(stmt_text) if kind != duckdb.token_type.comment]
    # EXPLAIN [ANALYZE] [(option, ...)] statement: find where the statement starts. A
    # parenthesis opens either the options or a parenthesised query, so try both.
    i = 1
    while i < len(tokens):
        try:
            inner = con.extract_statements(data[tokens[i]:].decode("utf-8"))
        except (duckdb.Error, ValueError):
            inner = None
        if inner is not None:
            return len(inner) == 1 and inner[0].type in _ALLOWED
        word = data[tokens[i]:tokens[i] + 8].lower()
        if word.startswith((b"analyze", b"analyse")):
            i += 1
        elif word.startswith(b"("):
            depth = 0
            while i < len(tokens):
                c = data[tokens[i]:tokens[i] + 1]
                depth += (c == b"(") - (c == b")")
                i += 1
                if depth == 0:
                    break
        else:
            return False
    return False


def check_sql(con: duckdb.DuckDBPyConnection, sql: str) -> list[duckdb.Statement]:
    """The statements of ``sql`` when every one of them is a query, else QueryRefused.

    A syntax error raises DuckDB's own ``ParserException``.
    """
    try:
        statements = con.extract_statements(sql)
    except ValueError as e:  # a statement kind newer than the Python enum: not a query
        raise QueryRefused(f"statement refused: the run store is read-only ({e})") from None
    if not statements:
        raise QueryRefused("no SQL statement given")
    for n, stmt in enumerate(statements, 1):
        try:
            t = stmt.type
        except ValueError:  # a kind newer than the Python enum (UPDATE EXTENSIONS): not a query
            t = None
        if t in _ALLOWED or (t == _EXPLAIN and _explained(stmt.query, con)):
            continue
        where = f" (statement {n} of {len(statements)})" if len(statements) > 1 else ""
        raise QueryRefused(f"{_kind(t) if t is not None else 'this statement'} refused{where}: the run store is "
                           "read-only; only queries (SELECT, WITH, DESCRIBE, SUMMARIZE, EXPLAIN) run")
    return statements


class QueryTimeout(Exception):
    """A query ran past its time limit and was interrupted."""


def run_readonly(con: duckdb.DuckDBPyConnection, sql: str,
                 timeout: float | None = None) -> tuple[pa.Table, list[str]]:
    """Run ``sql`` (one or more queries) on a read-only store connection.

    Every statement is checked before any runs; the result is the last one's table and
    DuckDB type names. With ``timeout`` (seconds), a query still running then is
    interrupted (``QueryTimeout``): SQL can describe unbounded work
    (``SELECT count(*) FROM range(1e15)``).
    """
    statements = check_sql(con, sql)
    timer = threading.Timer(timeout, con.interrupt) if timeout else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        for stmt in statements[:-1]:
            con.execute(stmt).fetchall()  # run for its errors; its rows are not shown
        rel = con.sql(statements[-1])
        if rel is None:
            return pa.table({}), []
        return rel.to_arrow_table(), [str(t) for t in rel.types]
    except duckdb.InterruptException:
        if timer is not None and not timer.is_alive():
            raise QueryTimeout(f"query interrupted after {timeout:g} s (the time limit)") from None
        raise
    finally:
        if timer is not None:
            timer.cancel()
