"""Compaction: Parquet copies of a finished run's NDJSON event files, and the way back.

``compact_run`` writes ``events/<name>.parquet`` (zstd) next to each
``events/<name>.ndjson`` and then ``events/compaction.json``, which records the
NDJSON size each copy was built from (``layout.copy_state`` compares it with the
NDJSON now). The views use a copy when it matches its NDJSON, when the NDJSON is
gone (archived: the copy is then the only record), or when the NDJSON is shorter
than it was (it lost lines the copy still has); so:

* the NDJSON files stay in place and remain the source of truth while they
  exist (a reader that opened the run before compaction keeps reading them);
* a copy whose index entry is missing (compaction interrupted) is ignored beside
  its NDJSON, and one whose NDJSON has grown since is ignored with a warning;
* compaction never overwrites a copy that holds events its NDJSON lacks: it
  keeps a copy whose NDJSON is gone, and refuses when the NDJSON shrank.

``restore_ndjson`` is the way back: a resume appends to NDJSON, so when a copy is
the only record of a file it first rebuilds the NDJSON from it (see recover.py).

All events are copied (every attempt and generation, damaged lines dropped), so
the views apply the same latest-attempt rules to either source and give
identical results. Turns are sorted by session (``SORTED_BY``); other files keep
file order. Each file is written under a temporary name and renamed into
place. DuckDB does the conversion itself (``COPY ... TO``): no rows pass through Python.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from askspec.runtime.store import layout
from askspec.runtime.store.lock import RunLockedError, acquire_writer_lock, release_writer_lock
from askspec.runtime.store.views import _parquet_missing, one_row, raw_events_sql


# Turns are written as sessions run, interleaved; their copy is sorted by session so
# that a reader of one session's turns (a TUI transcript) skips the other sessions'
# row groups by their min/max statistics. The views do not depend on row order, and
# restore_ndjson writes lines back in seq order.
SORTED_BY = {"turns": "run_id, session_id, attempt, seq"}
# ...in row groups small enough that the one holding a session is cheap to read: with
# DuckDB's default (122,880 rows) a 1M-turn run has 9 groups, and reading one session's
# turns decompressed a ninth of the file (~0.2 s); 8,192-row groups cut it to ~0.04 s
# for a 6% larger file (smaller groups cost more in metadata than they save).
ROW_GROUP_ROWS = {"turns": 8192}


class CompactError(Exception):
    """The run cannot be compacted (not a run, still being written, or its copies hold more)."""


def compact_run(run_dir: str | os.PathLike[str], *, force: bool = False) -> dict[str, int]:
    """Write Parquet copies of ``run_dir``'s event files; returns rows per file.

    Refuses a run whose manifest says ``running`` unless ``force`` (for a run
    whose process died without recording an end), and always refuses a run
    whose writer process is alive.
    """
    run_dir = Path(run_dir)
    if not layout.is_run_dir(run_dir):
        raise CompactError(f"not a run directory (no manifest.json): {run_dir}")
    try:
        manifest = layout.load_manifest(run_dir)
    except layout.ManifestError as e:
        raise CompactError(str(e)) from None
    if manifest.get("status") == "running" and not force:
        raise CompactError(
            f"run {manifest.get('run_id', run_dir.name)} is still running "
            "(use --force if its process is gone)"
        )
    try:
        # Holding the writer lock keeps a resume from appending mid-compaction.
        lock_fd = acquire_writer_lock(run_dir)
    except RunLockedError as e:
        raise CompactError(str(e)) from None
    try:
        con = duckdb.connect(":memory:")
        old_index = layout.read_compaction_index(run_dir)
        files: dict[str, dict[str, int]] = {}
        rows: dict[str, int] = {}
        for name in layout.EVENT_NAMES:
            state = layout.copy_state(run_dir, name, old_index)
            if state.kind == "only":
                # The copy is all there is: keep it, and its index entry.
                entry = old_index["files"].get(name)
                if isinstance(entry, dict):
                    files[name] = entry
                continue
            if state.kind == "ahead":
                raise CompactError(_ahead_message(run_dir, name, state))
            if state.kind in ("stale", "unindexed") and parquet_rows_not_in_ndjson(con, run_dir, name, state):
                raise CompactError(
                    f"{layout.parquet_path(run_dir, name)} holds events that {name}.ndjson lacks; "
                    "move one of the two files aside to choose which to keep")
            if state.ndjson_bytes is None:
                continue
            nd = layout.ndjson_path(run_dir, name)
            size = nd.stat().st_size
            target = layout.parquet_path(run_dir, name)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                order = f" ORDER BY {SORTED_BY[name]}" if name in SORTED_BY else ""
                groups = f", ROW_GROUP_SIZE {ROW_GROUP_ROWS[name]}" if name in ROW_GROUP_ROWS else ""
                (count,) = one_row(con,
                    f"COPY (SELECT * FROM ({raw_events_sql(name, [nd.resolve()], [])}){order}) TO '{_q(tmp)}' "
                    f"(FORMAT parquet, COMPRESSION zstd{groups})"
                )
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            files[name] = {"ndjson_bytes": size, "rows": int(count)}
            rows[name] = int(count)
        # Written last: only now do readers start using the copies.
        layout.write_json_atomic(
            layout.events_dir(run_dir) / layout.COMPACTION_INDEX,
            {"compacted_at": layout.utc_iso(), "format_version": layout.FORMAT_VERSION, "files": files},
        )
        con.close()
        return rows
    finally:
        release_writer_lock(lock_fd)


def _ahead_message(run_dir: Path, name: str, state: layout.CopyState) -> str:
    return (f"{layout.ndjson_path(run_dir, name)} ({state.ndjson_bytes} bytes) is shorter than when "
            f"{name}.parquet was made from it ({state.built_from} bytes): the Parquet copy holds events "
            "the NDJSON lost. Move one of the two files aside to choose which to keep")


def _parquet_select(con: duckdb.DuckDBPyConnection, run_dir: Path, name: str, state: layout.CopyState) -> str:
    pq = layout.parquet_path(run_dir, name)
    missing = _parquet_missing(con, pq, name, state.format_version)
    return raw_events_sql(name, [], [pq], {pq: missing} if missing else None)


def parquet_rows_not_in_ndjson(con: duckdb.DuckDBPyConnection, run_dir: Path, name: str,
                               state: layout.CopyState) -> int:
    """How many events of the Parquet copy its NDJSON lacks (by ``seq`` and ``ts``)."""
    nd = layout.ndjson_path(run_dir, name).resolve()
    (n,) = one_row(con,
        f"SELECT count(*) FROM (SELECT seq, ts FROM ({_parquet_select(con, run_dir, name, state)}) "
        f"EXCEPT ALL SELECT seq, ts FROM ({raw_events_sql(name, [nd], [])}))"
    )
    return int(n)


def restore_ndjson(run_dir: str | os.PathLike[str], name: str) -> int:
    """Rebuild ``events/<name>.ndjson`` from its Parquet copy; returns the number of lines.

    Lines come out in ``seq`` order with the writer's field order and time format.
    The file is written under a temporary name, read back and compared with the
    copy (every column of every row), fsynced, and only then renamed into place,
    replacing an empty or missing NDJSON. The copy itself is left alone; its index
    entry is updated to the new NDJSON's size.
    """
    run_dir = Path(run_dir)
    state = layout.copy_state(run_dir, name)
    nd = layout.ndjson_path(run_dir, name)
    tmp = nd.with_name(f".{nd.name}.{os.getpid()}.restore.tmp")
    con = duckdb.connect(":memory:")
    try:
        src = _parquet_select(con, run_dir, name, state)
        cols = layout.columns(name)
        items = ", ".join(
            f"strftime(\"{c}\", '%Y-%m-%dT%H:%M:%S.%fZ') AS \"{c}\"" if t == "TIMESTAMP" else f'"{c}"'
            for c, t in cols.items()
        )
        (count,) = one_row(con,
            f"COPY (SELECT {items} FROM ({src}) ORDER BY seq) TO '{_q(tmp)}' (FORMAT json)"
        )
        sel = ", ".join(f'"{c}"' for c in cols)
        (diff,) = one_row(con,
            f"SELECT count(*) FROM ((SELECT {sel} FROM ({src}) EXCEPT ALL "
            f"SELECT {sel} FROM ({raw_events_sql(name, [tmp.resolve()], [])})) UNION ALL "
            f"(SELECT {sel} FROM ({raw_events_sql(name, [tmp.resolve()], [])}) EXCEPT ALL "
            f"SELECT {sel} FROM ({src})))"
        )
        if diff:
            raise layout.RunDirError(f"rebuilding {nd} from {name}.parquet gave {diff} differing rows; "
                                     "nothing was changed")
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, nd)
        # The copy now matches this NDJSON: record its size, so the pair reads as
        # current (not as an NDJSON that shrank) until the copy is dropped.
        index = layout.read_compaction_index(run_dir)
        if isinstance(index["files"].get(name), dict):
            index["files"][name]["ndjson_bytes"] = nd.stat().st_size
            layout.write_json_atomic(layout.events_dir(run_dir) / layout.COMPACTION_INDEX, index)
        return int(count)
    finally:
        con.close()
        tmp.unlink(missing_ok=True)


def _q(path: Path) -> str:
    return os.fspath(path.resolve()).replace("'", "''")
