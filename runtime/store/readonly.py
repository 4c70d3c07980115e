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

The files themselves are checked when the store is opened (``layout.refused_file``):
only regular files inside a run's folder are read, never a symbolic link (wherever it
points), a FIFO, a device or a socket, so a run directory someone hands you cannot
make a query read ``~/.ssh`` or block on a pipe.

Resources. A query runs with DuckDB's ``memory_limit`` (``MEMORY_LIMIT``; an in-memory
store has nowhere to spill, so a query needing more fails with DuckDB's "Out of Memory
Error", raised as ``QueryTooLarge``). DuckDB does not count every allocation against
that limit (the text a string function builds, ``repeat('x', 2e9)``, is not), so while
a query runs the process may grow by no more than the limit and the result's size
limit (``RLIMIT_DATA``, where the platform has it: ``_growth_cap``); past it DuckDB's
allocation fails with the same error. The query runs under a watchdog that interrupts
it after its time limit and gives up on it if it still has not stopped ``STUCK_GRACE``
seconds later (a read blocked in the kernel
does not see the interrupt), and its result is fetched in batches up to ``Limits``
(rows, bytes, characters a text cell): a query can describe a result of any size
(``SELECT * FROM range(1e12)``, ``SELECT repeat('x', 1e9)``). A row that alone is past
the size limit is ``QueryTooLarge``.

Usage (the TUI does the same)::

    store = open_readonly_store(run_dir)       # or a folder of runs
    result = run_readonly(store.con, sql, timeout=60)   # .table, .types, .cut
    # QueryRefused, QueryTimeout, QueryTooLarge or duckdb.Error (one line each) on failure
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from askspec.lang.paths import human_size
from askspec.runtime.store.views import Store, connect


# DuckDB's memory limit for a query: 1 GiB, whatever the machine (DuckDB's own default is 80%
# of it): queries over a run's event files stream, and a query someone hands you must not
# take the machine (`SELECT repeat('x', 2e9)` built 2.5 GB under a quarter of 24 GiB). A
# query that needs more fails at once with DuckDB's "Out of Memory Error" and can be given
# more (``askspec query --memory-limit``).
MEMORY_LIMIT = "1024MiB"


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


def _lock(con: duckdb.DuckDBPyConnection, files: list[str], memory_limit: str) -> None:
    """Confine ``con`` to reading ``files`` within ``memory_limit``; irreversible for this
    connection."""
    quoted = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    con.execute("SET memory_limit = ?", [memory_limit])
    con.execute(f"SET allowed_paths = [{quoted}]")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET python_enable_replacements = false")  # no scans of the caller's variables
    con.execute("SET enable_external_access = false")  # can never be turned back on
    con.execute("SET lock_configuration = true")


def open_readonly_store(path: str | os.PathLike[str], memory_limit: str = MEMORY_LIMIT) -> Store:
    """The store views over ``path`` (a run dir or a folder of runs) on a locked connection.

    Raises ``StoreError`` when ``path`` holds no run, ``duckdb.Error`` for a
    ``memory_limit`` DuckDB does not read (``"2GB"``, ``"500MiB"``). Use ``run_readonly``
    (not ``con.sql``) to run user SQL on it: the connection lock alone does not stop a
    write to the run's own event files.
    """
    store = connect(path)
    try:
        _lock(store.con, [os.fspath(p) for p in store.files], memory_limit)
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
    """A query ran past its time limit and was interrupted (or abandoned, see run_readonly)."""


class QueryTooLarge(Exception):
    """A query that needs more memory than its limit, or a result row past the size
    limit (the message is one line and names the limit)."""


_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}


def memory_limit_of(con: duckdb.DuckDBPyConnection) -> tuple[str, int | None]:
    """DuckDB's memory_limit on ``con``: as DuckDB shows it ("286.1 MiB") and in bytes
    (None when it cannot be read)."""
    try:
        rows = con.execute("SELECT current_setting('memory_limit')").fetchall()
    except duckdb.Error:
        return "unknown", None
    text = str(rows[0][0]) if rows else ""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]+)\s*", text)
    if m is None or m.group(2) not in _UNITS:
        return text, None
    return text, int(float(m.group(1)) * _UNITS[m.group(2)])


def _data_size() -> int | None:
    """The process's data segment (VmData: what RLIMIT_DATA limits), in bytes."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


GROWTH_SLACK = 256 << 20  # besides DuckDB's limit and the result's: the interpreter's own
_cap_lock = threading.Lock()
_cap_users = 0
_cap_saved: tuple[int, int] | None = None


@contextlib.contextmanager
def _growth_cap(grow: int | None):
    """While the block runs, the process's data segment may grow by at most ``grow``
    bytes (RLIMIT_DATA's soft limit; never raised, only lowered, and put back after): an
    allocation past it fails, which DuckDB reports as its Out of Memory Error. Queries
    running at once share the first one's cap. Nothing where the platform has no
    RLIMIT_DATA or no /proc."""
    global _cap_users, _cap_saved
    try:
        import resource
    except ImportError:  # not on this platform
        resource = None  # type: ignore[assignment]
    if grow is None or resource is None or not hasattr(resource, "RLIMIT_DATA"):
        yield
        return
    with _cap_lock:
        if _cap_users == 0:
            now = _data_size()
            if now is not None:
                soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
                cap = now + grow
                if hard != resource.RLIM_INFINITY:
                    cap = min(cap, hard)
                if soft == resource.RLIM_INFINITY or cap < soft:
                    try:
                        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
                        _cap_saved = (soft, hard)
                    except (OSError, ValueError):
                        _cap_saved = None
        _cap_users += 1
    try:
        yield
    finally:
        with _cap_lock:
            _cap_users -= 1
            if _cap_users == 0 and _cap_saved is not None:
                try:
                    resource.setrlimit(resource.RLIMIT_DATA, _cap_saved)
                finally:
                    _cap_saved = None


# Seconds a query may take to stop once interrupted before it is abandoned: DuckDB sees
# an interrupt between vectors, within milliseconds, unless a read is blocked.
STUCK_GRACE = 3.0


@dataclass(frozen=True)
class Limits:
    """How much of a result ``run_readonly`` fetches (None: no limit)."""

    rows: int | None = 100_000
    bytes: int | None = 512 << 20  # Arrow bytes fetched (strings, numbers, offsets)
    cell_chars: int | None = 1 << 20  # characters of one text (or JSON) cell
    # read on past the row or size limit to count the rows (dropping them: memory stays
    # bounded, time does not: the watchdog's timeout bounds it)
    count: bool = False


class QueryResult(NamedTuple):
    """A query's (possibly cut) result: its table, DuckDB type names, ``cut``, a phrase
    saying what was left out (None when the result is whole), and ``rows``, how many rows
    the query gave (``table.num_rows`` unless it was cut and ``Limits.count`` counted on;
    None when cut uncounted)."""

    table: pa.Table
    types: list[str]
    cut: str | None
    rows: int | None


_BATCH_ROWS = 1024  # with Limits.cell_chars, bounds what one fetch can hold


def _capped_cells(rel: duckdb.DuckDBPyRelation, chars: int) -> duckdb.DuckDBPyRelation:
    """``rel`` with its text and JSON columns cut to ``chars + 1`` characters inside
    DuckDB, so a huge cell never reaches Arrow (one more: ``_cut_cells`` sees the cut)."""
    types = [str(t) for t in rel.types]
    if not any(t in ("VARCHAR", "JSON") for t in types):
        return rel
    # positional references: a result may repeat a column name
    items = [f"left(#{i}::VARCHAR, {chars + 1})" if t in ("VARCHAR", "JSON") else f"#{i}"
             for i, t in enumerate(types, 1)]
    return rel.project(", ".join(f'{e} AS "{c.replace(chr(34), chr(34) * 2)}"'
                                 for e, c in zip(items, rel.columns)))


def _cut_cells(batch: pa.RecordBatch, chars: int) -> tuple[pa.RecordBatch, int]:
    """``batch`` with string cells longer than ``chars`` cut to it; how many were."""
    cols, n = [], 0
    for col in batch.columns:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            long = pc.greater(pc.utf8_length(col), chars)
            k = pc.sum(long).as_py() or 0
            if k:
                col = pc.if_else(long, pc.utf8_slice_codeunits(col, 0, chars), col)
                n += k
        cols.append(col)
    return (pa.RecordBatch.from_arrays(cols, schema=batch.schema) if n else batch), n


def _fetch(rel: duckdb.DuckDBPyRelation, limits: Limits) -> tuple[pa.Table, str | None, int | None]:
    """The rows of ``rel`` up to ``limits``, fetched in batches; what was cut, if anything;
    how many rows there were (None: cut, not counted)."""
    if limits.cell_chars is not None:
        rel = _capped_cells(rel, limits.cell_chars)
    reader = rel.to_arrow_reader(_BATCH_ROWS)
    batches: list[pa.RecordBatch] = []
    kept = size = seen = cut_cells = 0
    cut = None
    try:
        for batch in reader:
            seen += batch.num_rows
            if cut:  # past a limit, counting on (Limits.count)
                continue
            if limits.bytes is not None and size + batch.nbytes > limits.bytes:
                fit = _rows_within(batch, limits.bytes - size)
                if kept + fit == 0:
                    raise QueryTooLarge(f"the result's first row is {human_size(batch.slice(0, 1).nbytes)}, past the "
                                        f"size limit of {human_size(limits.bytes)}: select less of it (left(text, N), "
                                        f"fewer columns)")
                if fit:
                    batches.append(batch.slice(0, fit))
                    kept += fit
                    size += batches[-1].nbytes
                cut = (f"only the first {kept:,} rows are shown: the next would pass "
                       f"{human_size(limits.bytes)} (the size limit)")
            else:
                if limits.rows is not None and kept + batch.num_rows > limits.rows:
                    batch = batch.slice(0, limits.rows - kept)
                    cut = f"only the first {limits.rows:,} rows are shown (the row limit)"
                if limits.cell_chars is not None:
                    batch, k = _cut_cells(batch, limits.cell_chars)
                    cut_cells += k
                batches.append(batch)
                kept += batch.num_rows
                size += batch.nbytes
            if cut and not limits.count:
                break
    finally:
        reader.close()  # a streaming query stops here: the rest is never computed
    if cut_cells:
        cells = (f"{cut_cells:,} text cell{'s' if cut_cells != 1 else ''} longer than "
                 f"{limits.cell_chars:,} characters cut to that length")
        cut = f"{cut}; {cells}" if cut else cells
    counted = not cut or limits.count or kept == seen
    return pa.Table.from_batches(batches, schema=reader.schema), cut, seen if counted else None


def _rows_within(batch: pa.RecordBatch, room: int) -> int:
    """How many of ``batch``'s first rows take no more than ``room`` bytes."""
    lo, hi = 0, batch.num_rows
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if batch.slice(0, mid).nbytes <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _stop(con: duckdb.DuckDBPyConnection, done: threading.Event) -> bool:
    """Interrupt what runs on ``con`` until it is ``done`` (True) or STUCK_GRACE seconds
    pass (False). Again and again: an interrupt that comes while no statement is running
    (between two of several) is lost."""
    deadline = time.monotonic() + STUCK_GRACE
    while True:
        con.interrupt()
        if done.wait(0.1):
            return True
        if time.monotonic() > deadline:
            return False


def run_readonly(con: duckdb.DuckDBPyConnection, sql: str, timeout: float | None = None,
                 limits: Limits = Limits()) -> QueryResult:
    """Run ``sql`` (one or more queries) on a read-only store connection.

    Every statement is checked before any runs; the result is the last one's table and
    DuckDB type names, fetched up to ``limits``. With ``timeout`` (seconds), a query
    still running then is interrupted (``QueryTimeout``): SQL can describe unbounded
    work (``SELECT count(*) FROM range(1e15)``). One that does not stop within
    ``STUCK_GRACE`` seconds of the interrupt is abandoned (``QueryTimeout`` all the
    same): ``con`` stays busy with it, so use a fresh cursor for what follows.
    """
    statements = check_sql(con, sql)
    shown, memory = memory_limit_of(con)
    # what the process may grow by while the query runs: DuckDB's limit, the result's, slack
    grow = None if memory is None else memory + (limits.bytes if limits.bytes is not None else memory) + GROWTH_SLACK

    def work() -> QueryResult:
        try:
            with _growth_cap(grow):
                for stmt in statements[:-1]:
                    con.execute(stmt)
                    con.complete()  # run to its end for its errors; its rows are not shown (nor fetched)
                rel = con.sql(statements[-1])
                if rel is None:
                    return QueryResult(pa.table({}), [], None, 0)
                types = [str(t) for t in rel.types]
                table, cut, rows = _fetch(rel, limits)
                return QueryResult(table, types, cut, rows)
        except (duckdb.OutOfMemoryException, MemoryError, pa.ArrowMemoryError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            if not first.startswith("Out of Memory Error"):
                first = f"Out of Memory Error: {first}"
            raise QueryTooLarge(f"{first} (the query's memory limit is {shown})") from None

    if not timeout:
        return work()
    # The watchdog: the query runs on a thread of its own, so that this one can give up
    # on it even when an interrupt cannot reach it.
    outcome: list = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as e:  # handed to the caller's thread below
            outcome.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name="askspec-query", daemon=True).start()
    try:
        timed_out = not done.wait(timeout)
    except BaseException:  # Ctrl-C while waiting: stop the query too
        _stop(con, done)
        raise
    if timed_out:
        if not _stop(con, done):
            raise QueryTimeout(f"query interrupted after {timeout:g} s (the time limit); it did not stop, "
                               "so it was abandoned (a file it reads may be blocking)")
    result = outcome[0]
    if isinstance(result, BaseException):
        if timed_out and isinstance(result, duckdb.InterruptException):
            raise QueryTimeout(f"query interrupted after {timeout:g} s (the time limit)") from None
        raise result
    return result
