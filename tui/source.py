"""``Source``: what the TUI has open — a folder of runs or one run directory — as the
store's views (``views.connect``) plus a ``RunMirror`` per run being looked at.

Each call takes its own cursor (DuckDB connections are not shared across threads). The
store is reopened when the set of runs or their Parquet copies changes (the views fix
the file set when opened; contents are read live); a run's mirror is kept across a
reopen while its files stay the same. Nothing here imports Textual.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from pathlib import Path
from typing import Iterator

import duckdb

from askspec.runtime.store import layout, liveness, readonly, views
from askspec.terminal import printable
from askspec.tui.mirror import RunMirror

# The one place that opens a store: read-only and confined to the run's files (the SQL
# console runs user SQL on it; everything else here only queries the views).
_connect = readonly.open_readonly_store


class DataError(Exception):
    """Something the user should read (one line), not a crash."""


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return printable(first, single_line=True)


def check_path(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be opened (a one-line message), or None if it can.

    A folder without runs is not an error: the runs screen says so itself."""
    p = Path(path)
    if not p.exists():
        return f"no such directory: {p}"
    if not p.is_dir():
        return f"not a directory: {p} (give a run directory or a folder of runs)"
    return None


def fingerprint(path: str | os.PathLike[str]) -> tuple:
    """Cheap change detector for follow mode: the runs under ``path`` and the sizes and
    modification times of their manifests and event files (a few stat calls per run), and
    each run's shown status (a run whose process died changes no file: liveness.py)."""
    out: list[tuple[str, int | str | None, int | None]] = []
    for d in layout.find_run_dirs(path):
        out.append((str(d), liveness.shown_status_of_file(layout.manifest_path(d)), None))
        files = [layout.manifest_path(d)] + sorted(layout.events_dir(d).glob("*.ndjson"))
        for f in files:
            try:
                st = f.stat()
                out.append((str(f), st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((str(f), None, None))
    return tuple(out)


class Source:
    """A reopenable store over a folder of runs or a single run directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._store: views.Store | None = None
        self._key: tuple | None = None
        self._mirrors: dict[str, RunMirror] = {}
        self._background: dict[str, set[duckdb.DuckDBPyConnection]] = {}
        self._paused: set[str] = set()
        # every cursor handed out and still in use, for ``close`` to interrupt
        self._cursors: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()
        self._closed = False
        self.warnings: list[str] = []

    def run_dirs(self) -> list[Path]:
        return layout.find_run_dirs(self.path)

    def _listing_key(self) -> tuple:
        dirs = self.run_dirs()
        compacted: list[int | None] = []
        for d in dirs:
            idx = layout.events_dir(d) / layout.COMPACTION_INDEX
            try:
                compacted.append(idx.stat().st_mtime_ns)
            except OSError:
                compacted.append(None)
        return tuple(str(d) for d in dirs), tuple(compacted)

    def store(self) -> views.Store:
        """The open store, reopened first if the runs changed. Raises DataError when
        there is nothing to open."""
        problem = check_path(self.path)
        if problem:
            raise DataError(problem)
        with self._lock:
            key = self._listing_key()
            if self._store is None or key != self._key:
                if not key[0]:
                    raise DataError(f"no runs in {self.path}")
                try:
                    store = _connect(self.path)
                except (views.StoreError, duckdb.Error, OSError) as e:  # (a copy from an older version...)
                    raise DataError(one_line(e)) from None
                self._store, self._key = store, key
                self.warnings = [printable(m, single_line=True) for _, m in store.warnings]
                for run_id, mirror in list(self._mirrors.items()):
                    if store.sources.get(run_id) != mirror.sources:  # compacted, resumed, gone
                        del self._mirrors[run_id]
            return self._store

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of its own for the calling thread over the store's views."""
        cur = self.store().con.cursor()
        with self._lock:
            if self._closed:
                cur.close()
                raise DataError("closing")
            self._cursors.add(cur)
        return cur

    def close(self) -> None:
        """Interrupt every query running on this store and refuse new ones: the app is
        quitting, and a worker thread in a long query (a console query may run 120 s)
        would keep the process alive until it ended."""
        with self._lock:
            self._closed = True
            cursors = list(self._cursors)
        for cur in cursors:
            try:
                cur.interrupt()
            except duckdb.Error:  # closed meanwhile: nothing runs on it
                pass

    @contextlib.contextmanager
    def background(self, tag: str) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor for work nobody waits on (the runs screen's counts over every run),
        which ``pause(tag)`` stops and keeps from starting until ``resume(tag)``: work
        stopped that way raises DataError."""
        cur = self.cursor()
        with self._lock:
            if tag in self._paused:
                cur.close()
                raise DataError(f"{tag}: interrupted")
            self._background.setdefault(tag, set()).add(cur)
        try:
            yield cur
        except duckdb.InterruptException:
            raise DataError(f"{tag}: interrupted") from None
        finally:
            with self._lock:
                self._background[tag].discard(cur)
            cur.close()

    def pause(self, tag: str) -> None:
        """Stop the queries running under ``tag`` and refuse new ones (their screen went
        out of view)."""
        with self._lock:
            self._paused.add(tag)
            for cur in self._background.get(tag, ()):
                cur.interrupt()

    def resume(self, tag: str) -> None:
        with self._lock:
            self._paused.discard(tag)

    def indexing(self, run_id: str) -> float | None:
        """How far the run's turn index is built (0..1) while it is being built, else
        None (cheap: for a progress line on the UI thread)."""
        m = self._mirrors.get(run_id)
        index = m.turn_index if m is not None else None
        if index is None or not index.size or index.indexed >= index.size:
            return None
        return index.indexed / index.size

    def mirror(self, run_id: str) -> RunMirror:
        """The run's mirror (created empty on first use: ``refresh`` fills it)."""
        store = self.store()
        with self._lock:
            m = self._mirrors.get(run_id)
            if m is None:
                sources = store.sources.get(run_id)
                if sources is None:
                    raise DataError(f"no run {run_id} under {self.path}")
                m = self._mirrors[run_id] = RunMirror(run_id, sources)
            return m
