"""Compaction: Parquet copies of a finished run's NDJSON event files.

``compact_run`` writes ``events/<name>.parquet`` (zstd) next to each
``events/<name>.ndjson`` and then ``events/compaction.json``, which records the
NDJSON size each copy was built from. The views use a copy only when that
index says it matches the current NDJSON size, so:

* the NDJSON files stay in place and remain the source of truth (a reader that
  opened the run before compaction keeps reading them; nothing moves under it);
* a copy whose index entry is missing (compaction interrupted) is ignored, and
  one whose NDJSON has grown since (a resumed run) is ignored with a warning;
  ``RunWriter.open_for_resume`` also deletes the copies.

All events are copied (every attempt and generation, torn lines dropped), so the
views apply the same latest-attempt rules to either source and give identical
results. Each file is written under a temporary name and renamed into place.
DuckDB does the conversion itself (``COPY ... TO``): no rows pass through Python.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from askspec.runtime.store import layout
from askspec.runtime.store.views import raw_events_sql
from askspec.runtime.store.lock import RunLockedError, acquire_writer_lock, release_writer_lock


class CompactError(Exception):
    """The run cannot be compacted (not a run, or still being written)."""


def compact_run(run_dir: str | os.PathLike[str], *, force: bool = False) -> dict[str, int]:
    """Write Parquet copies of ``run_dir``'s event files; returns rows per file.

    Refuses a run whose manifest says ``running`` unless ``force`` (for a run
    whose process died without recording an end), and always refuses a run
    whose writer process is alive.
    """
    run_dir = Path(run_dir)
    if not layout.is_run_dir(run_dir):
        raise CompactError(f"not a run directory (no manifest.json): {run_dir}")
    manifest = layout.read_manifest(run_dir)
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
        files: dict[str, dict[str, int]] = {}
        rows: dict[str, int] = {}
        for name in layout.EVENT_NAMES:
            nd = layout.ndjson_path(run_dir, name)
            if not nd.exists():
                continue
            size = nd.stat().st_size
            target = layout.parquet_path(run_dir, name)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                (count,) = con.execute(
                    f"COPY ({raw_events_sql(name, [nd.resolve()], [])}) TO '{_q(tmp)}' "
                    "(FORMAT parquet, COMPRESSION zstd)"
                ).fetchone()
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            files[name] = {"ndjson_bytes": size, "rows": int(count)}
            rows[name] = int(count)
        # Written last: only now do readers start using the copies.
        layout.write_json_atomic(
            layout.events_dir(run_dir) / layout.COMPACTION_INDEX,
            {"compacted_at": layout.utc_iso(), "files": files},
        )
        con.close()
        return rows
    finally:
        release_writer_lock(lock_fd)


def _q(path: Path) -> str:
    return os.fspath(path.resolve()).replace("'", "''")
