"""What a resume does to a run directory before appending to it, so that it loses nothing.

``prepare_for_append`` runs under the writer lock (``RunWriter.open_for_resume``):

1. **Copies.** Appending needs NDJSON files. Per event file (``layout.copy_state``):
   a Parquet copy that is the only record (NDJSON archived or emptied) is turned
   back into NDJSON (``compact.restore_ndjson``, verified row by row) before
   anything else; a copy the NDJSON fully contains is dropped (it is a cache that
   appending would make stale); a copy holding events its NDJSON lacks, or an
   event file missing with no copy, stops the resume with an explanation.
   Nothing recorded is ever deleted.
2. **Damaged lines** (``check.py``) are moved to ``events/quarantine.ndjson``
   with file, line number and reason. Files exactly as their last writer closed
   them (size and mtime recorded by ``finish``) are not scanned.
3. **A torn last line** that is complete JSON only lacks its newline: it is kept
   and terminated.

It returns what it did, for the manifest and for warnings shown to the user.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from askspec.runtime.store import check, layout


@dataclass
class Prepared:
    restored: list[dict[str, Any]] = field(default_factory=list)  # manifest "restored" records
    quarantined: list[dict[str, Any]] = field(default_factory=list)  # manifest "quarantined" records
    notes: list[str] = field(default_factory=list)  # one line each, for the user


def prepare_for_append(run_dir: Path, manifest: dict[str, Any], gen: int) -> Prepared:
    """Make ``run_dir``'s NDJSON files complete and clean (see the module docstring)."""
    out = Prepared()
    _reconcile_copies(run_dir, gen, out)
    given = manifest.get("closed_files")
    closed = given if isinstance(given, dict) else {}
    now = layout.utc_iso()
    for name in layout.EVENT_NAMES:
        path = layout.ndjson_path(run_dir, name)
        if closed.get(name) is not None and closed.get(name) == check.file_stamp(path):
            continue  # untouched since its writer closed it: only valid lines
        bad = check.scan_file(path, name)
        if bad:
            check.quarantine_damaged(run_dir, name, bad, gen=gen, ts=now)
            out.quarantined.append({"file": f"{name}.ndjson", "lines": len(bad), "gen": gen})
            shown = "; ".join(f"line {b.line}: {b.reason}" for b in bad[:3])
            more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
            out.notes.append(f"events/{name}.ndjson: moved {len(bad)} damaged line(s) to "
                             f"events/{layout.QUARANTINE} ({shown}{more})")
        _terminate_last_line(path)
    return out


def _reconcile_copies(run_dir: Path, gen: int, out: Prepared) -> None:
    index = layout.read_compaction_index(run_dir)
    states = {name: layout.copy_state(run_dir, name, index) for name in layout.EVENT_NAMES}
    # Refuse before changing anything.
    for name, st in states.items():
        path = layout.ndjson_path(run_dir, name)
        if st.ndjson_bytes is None and (path.exists() or path.is_symlink()):
            raise layout.RunDirError(f"{path} is not a regular file; move it aside to resume")
        if st.kind == "none" and st.ndjson_bytes is None and name not in layout.LATER_EVENTS:
            raise layout.RunDirError(
                f"{layout.ndjson_path(run_dir, name)} is missing and there is no Parquet copy of it: "
                f"the run's {name} events are gone. Restore the file to resume, or create it empty "
                "to resume without them")
        if st.kind == "ahead":
            from askspec.runtime.store.compact import _ahead_message

            raise layout.RunDirError(_ahead_message(run_dir, name, st))
    doubtful = [n for n, st in states.items() if st.kind in ("stale", "unindexed")]
    if doubtful:
        import duckdb

        from askspec.runtime.store.compact import parquet_rows_not_in_ndjson

        con = duckdb.connect(":memory:")
        try:
            for name in doubtful:
                lacking = parquet_rows_not_in_ndjson(con, run_dir, name, states[name])
                if lacking:
                    raise layout.RunDirError(
                        f"{layout.parquet_path(run_dir, name)} holds {lacking} event(s) that {name}.ndjson "
                        "lacks: move one of the two files aside to choose which to resume from")
        finally:
            con.close()
    for name, st in states.items():
        if st.kind != "only":
            continue
        from askspec.runtime.store.compact import restore_ndjson

        try:
            rows = restore_ndjson(run_dir, name)
        except duckdb_error() as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise layout.RunDirError(f"cannot rebuild {layout.ndjson_path(run_dir, name)} from "
                                     f"{name}.parquet, the only copy of these events: {first}") from None
        out.restored.append({"file": f"{name}.ndjson", "from": f"{name}.parquet", "rows": rows, "gen": gen})
        out.notes.append(f"events/{name}.ndjson rebuilt from {name}.parquet ({rows} events)")
    # Every copy is now contained in its NDJSON, which is about to grow: drop them
    # (the index first, so a reader never pairs a copy with a grown NDJSON).
    if any(st.kind != "none" for st in states.values()):
        (layout.events_dir(run_dir) / layout.COMPACTION_INDEX).unlink(missing_ok=True)
        for name, st in states.items():
            if st.kind != "none":
                layout.parquet_path(run_dir, name).unlink(missing_ok=True)


def duckdb_error() -> type[Exception]:
    import duckdb

    return duckdb.Error


def _terminate_last_line(path: Path) -> None:
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            layout.write_all(fd, b"\n")
    finally:
        os.close(fd)
