"""``RunMirror``: one run's session, reward, group and match events in an in-memory DuckDB
database, kept current by reading only what was appended to their files.

The sessions table, its reward columns, the run's counts and a transcript's session row
and rewards are queried here, through the store's own views (``views.define_views``
over these tables), so a live 100k-session run costs a parse of its new lines per
refresh instead of all of them, and the sessions table's first paint parses
``sessions.ndjson`` once (rewards follow, for the reward columns). A compacted run's
Parquet copies are read once. Turns are not copied (a 1M-turn run is gigabytes): a
transcript reads its session's lines through a ``LineIndex`` (or, for a compacted run,
with a filter that lets DuckDB skip the Parquet row groups of other sessions) into a
small database of its own with the same views (``session_store``).

Lines are read with the store's ``raw_events_sql`` (the file itself the first time,
then what was appended, handed over as a small temporary file), so a line means here
exactly what it means to the views (typed columns, torn or invalid lines dropped). A
file that was replaced or shrank is read again from the start. Nothing here imports
Textual.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import duckdb

from askspec.runtime.store import layout
from askspec.runtime.store.views import EventSource, define_views, raw_events_sql
from askspec.tui.index import LineIndex

MIRRORED = ("sessions", "rewards", "groups", "matches")


def _empty_tables(con: duckdb.DuckDBPyConnection, names: tuple[str, ...]) -> None:
    """``events_<name>``: an empty table for each of ``names``, an empty view for the rest."""
    for name in layout.EVENT_NAMES:
        kind = "TABLE" if name in names else "VIEW"
        con.execute(f"CREATE {kind} events_{name} AS {raw_events_sql(name, [], [])}")


def _insert_lines(con: duckdb.DuckDBPyConnection, name: str, data: bytes, after_seq: int = 0) -> None:
    """Insert NDJSON ``data`` (whole lines) into ``events_<name>``: the lines after seq
    ``after_seq``."""
    fd, tmp = tempfile.mkstemp(prefix=f"askspec-tui-{name}-", suffix=".ndjson")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        con.execute(f"INSERT INTO events_{name} SELECT * FROM ({raw_events_sql(name, [Path(tmp)], [])}) "
                    "WHERE seq > ?", [after_seq])
    finally:
        os.unlink(tmp)


def _line_start(path: Path, size: int) -> int:
    """The offset just after the last newline before ``size`` in ``path`` (0 if none)."""
    with open(path, "rb") as f:
        pos = size
        while pos > 0:
            step = min(pos, 1 << 16)
            f.seek(pos - step)
            nl = f.read(step).rfind(b"\n")
            if nl >= 0:
                return pos - step + nl + 1
            pos -= step
    return 0


class _Tail:
    """How far one NDJSON file has been read: a byte offset at the start of a line, and
    the last ``seq`` loaded (the writer's ``seq`` increases in file order).

    The first read parses the file in place (no copy: the first paint of a large run
    waits for it) and may see lines appended after the offset was taken; the next read
    starts at that offset and skips the lines whose ``seq`` was loaded already."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.seq = 0
        self.ident: tuple[int, int] | None = None

    def load(self, con: duckdb.DuckDBPyConnection, name: str) -> bool:
        """Insert the lines appended since the last call into ``events_<name>`` (after
        emptying it if the file was replaced or shrank); whether anything changed."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        ident = (st.st_dev, st.st_ino)
        restart = self.ident is not None and (ident != self.ident or st.st_size < self.offset)
        if restart:
            con.execute(f"DELETE FROM events_{name}")
            self.offset, self.seq = 0, 0
        first = self.ident is None or restart
        self.ident = ident
        if st.st_size == self.offset:
            return restart
        if first:
            con.execute(f"INSERT INTO events_{name} {raw_events_sql(name, [self.path], [])}")
            self.offset = _line_start(self.path, st.st_size)
        else:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
            cut = data.rfind(b"\n") + 1  # a line without its newline yet waits for it
            if not cut:
                return restart
            self.offset += cut
            _insert_lines(con, name, data[:cut], self.seq)
        row = con.execute(f"SELECT max(seq) FROM events_{name}").fetchone()
        top = row[0] if row else None
        changed = (top or 0) > self.seq
        self.seq = max(self.seq, top or 0)
        return changed or restart


class RunMirror:
    """The mirrored events of run ``run_id``, whose event files are ``sources``
    (``Store.sources``)."""

    def __init__(self, run_id: str, sources: dict[str, EventSource]) -> None:
        self.run_id = run_id
        self.sources = dict(sources)
        self.con = duckdb.connect(":memory:")
        _empty_tables(self.con, MIRRORED)
        define_views(self.con)
        self._lock = threading.Lock()
        self._mini_lock = threading.Lock()
        self._mini: duckdb.DuckDBPyConnection | None = None
        self._tails: dict[str, _Tail] = {}
        self._parquet_read: set[str] = set()
        self.loaded: set[str] = set()  # the kinds read at least once
        self.version = 0  # counts the refreshes that changed something
        self.memo: dict = {}  # results of queries over this version (data.py)
        turns = self.sources.get("turns")
        self.turn_index = LineIndex(turns.path) if turns is not None and turns.path.suffix == ".ndjson" else None

    def refresh(self, names: tuple[str, ...] = MIRRORED) -> bool:
        """Read what was appended to the files of ``names``; whether anything changed."""
        changed = False
        with self._lock:
            for name in names:
                changed |= self._refresh(name)
                self.loaded.add(name)
            if changed:
                self.version += 1
        return changed

    def _refresh(self, name: str) -> bool:
        src = self.sources.get(name)
        if src is None:
            return False
        cur = self.con.cursor()
        try:
            if src.path.suffix == ".parquet":
                if name in self._parquet_read:
                    return False  # a compacted run does not grow (a resume removes its copies)
                cur.execute(f"INSERT INTO events_{name} {src.sql(name)}")
                self._parquet_read.add(name)
                return True
            return self._tails.setdefault(name, _Tail(src.path)).load(cur, name)
        finally:
            cur.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.con.cursor()

    @contextlib.contextmanager
    def session_store(self, session_id: str) -> Iterator[duckdb.DuckDBPyConnection]:
        """A small database holding one session's events, with the store's views over
        them (one per mirror, reused: refilled for each session, used by one caller at a
        time).

        Its session and reward lines come from the mirror; its turns from the turn index
        (NDJSON: the lines are read by offset, new ones indexed first) or from the
        Parquet copy, filtered on the session so that DuckDB reads only the row groups
        that can hold it."""
        with self._mini_lock:
            mini = self._session_db()
            for name in ("sessions", "rewards", "turns"):
                mini.execute(f"DELETE FROM events_{name}")
            cur = self.cursor()
            try:
                for name in ("sessions", "rewards"):
                    rows = cur.sql(f"SELECT * FROM events_{name} WHERE run_id = ? AND session_id = ?",
                                   params=[self.run_id, session_id]).to_arrow_table()
                    mini.register("_rows", rows)
                    mini.execute(f"INSERT INTO events_{name} SELECT * FROM _rows")
                    mini.unregister("_rows")
            finally:
                cur.close()
            turns = self.sources.get("turns")
            if self.turn_index is not None:
                lines = self.turn_index.lines(session_id)
                if lines:
                    _insert_lines(mini, "turns", b"".join(lines))
            elif turns is not None:
                mini.execute(f"INSERT INTO events_turns SELECT * FROM ({turns.sql('turns')}) "
                             "WHERE run_id = ? AND session_id = ?", [self.run_id, session_id])
            yield mini

    def head_store(self, name: str, nbytes: int, rows: int) -> duckdb.DuckDBPyConnection:
        """A new database (the caller closes it) with the store's views over the first
        events of file ``name``: its first ``nbytes`` of whole lines, or the first
        ``rows`` of its Parquet copy. For a first paint of a large run before its whole
        file has been read (``data.first_sessions``)."""
        con = duckdb.connect(":memory:")
        _empty_tables(con, (name,))
        define_views(con)
        src = self.sources.get(name)
        if src is None:
            return con
        if src.path.suffix == ".parquet":
            con.execute(f"INSERT INTO events_{name} SELECT * FROM ({src.sql(name)}) LIMIT {int(rows)}")
            return con
        with open(src.path, "rb") as f:
            head = f.read(nbytes)
        cut = head.rfind(b"\n") + 1
        if cut:
            _insert_lines(con, name, head[:cut])
        return con

    def _session_db(self) -> duckdb.DuckDBPyConnection:
        if self._mini is None:
            self._mini = duckdb.connect(":memory:")
            _empty_tables(self._mini, ("sessions", "rewards", "turns"))
            define_views(self._mini)
        return self._mini

    def warm(self) -> None:
        """Do ahead what the first transcript would wait for: index the turns (one pass
        over the turns file, the first time) and set up the per-session database."""
        if self.turn_index is not None:
            self.turn_index.update()
        with self._mini_lock:
            self._session_db()

    def close(self) -> None:
        self.con.close()
        if self._mini is not None:
            self._mini.close()
