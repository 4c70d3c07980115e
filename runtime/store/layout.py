"""On-disk layout of a run directory and the schema of its event files.

A run directory ``<out>/<run-id>/`` holds::

    manifest.json          run metadata; replaced atomically (tmp + os.replace)
    ir.json, ir.hash       the compiled game graph and its content hash
    spec/                  the spec text and prompt files exactly as run
    events/<name>.ndjson   append-only event logs, one JSON object per line
    events/<name>.parquet  optional compacted copies (see compact.py)
    events/compaction.json which NDJSON sizes the Parquet files were built from

This module is the single source of truth for file names and column types: the
writer produces these fields, the views and the compactor read them with exactly
these DuckDB types (explicit types keep empty files and schema drift harmless).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import secrets
import time
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1

MANIFEST = "manifest.json"
IR_JSON = "ir.json"
IR_HASH = "ir.hash"
SPEC_DIR = "spec"
EVENTS_DIR = "events"
COMPACTION_INDEX = "compaction.json"

# Columns every event line carries. ``seq`` is per file and strictly increasing in
# file order; ``gen`` is the writer generation (0 when created, +1 per resume).
COMMON_COLUMNS: dict[str, str] = {
    "seq": "BIGINT",
    "ts": "TIMESTAMP",  # ISO-8601 UTC ("...Z"); TIMESTAMP (not TIMESTAMPTZ) needs no pytz
    "run_id": "VARCHAR",
    "gen": "INTEGER",
}

# Event file name -> its own columns (after the common ones). Order matters only
# for ``SELECT *`` readability.
EVENT_SCHEMAS: dict[str, dict[str, str]] = {
    "sessions": {
        "event": "VARCHAR",  # started | finished
        "session_id": "VARCHAR",
        "attempt": "INTEGER",
        "index": "BIGINT",
        "game": "VARCHAR",
        "group_id": "VARCHAR",
        "params": "JSON",
        "status": "VARCHAR",  # ok | error (finished only)
        "outcome": "VARCHAR",
        "error": "VARCHAR",
        "vars": "JSON",
        # the engine's own record (stateful calls, buffer pushes, dropped turns), kept out of vars
        "bookkeeping": "JSON",
    },
    "turns": {
        "session_id": "VARCHAR",
        "attempt": "INTEGER",
        "turn_index": "INTEGER",
        "role": "VARCHAR",
        "model": "VARCHAR",
        "prompt": "JSON",
        "text": "VARCHAR",
        "parsed": "JSON",
        "finish_reason": "VARCHAR",
        "tokens_in": "INTEGER",
        "tokens_out": "INTEGER",
        "latency_ms": "DOUBLE",
        "error": "VARCHAR",
        "group_id": "VARCHAR",  # a group route's judge call (its session_id is the group id)
    },
    "rewards": {
        "session_id": "VARCHAR",
        "attempt": "INTEGER",
        "role": "VARCHAR",
        "turn_index": "INTEGER",
        "name": "VARCHAR",
        "value": "DOUBLE",
        "kind": "VARCHAR",  # turn | terminal
    },
    "groups": {
        "group_id": "VARCHAR",
        "route": "VARCHAR",
        "stats": "JSON",
        "members": "VARCHAR[]",
        "judge_calls": "INTEGER",  # judge calls the route made for this group
        "unparsed": "INTEGER",  # of those, the ones that gave no parseable verdict
    },
    "matches": {
        "group_id": "VARCHAR",
        "a": "VARCHAR",
        "b": "VARCHAR",
        "first_shown": "VARCHAR",
        "verdict": "VARCHAR",
        "outcome": "DOUBLE",
        "raw": "VARCHAR",
    },
    "train_steps": {
        "role": "VARCHAR",
        "step": "BIGINT",
        "metrics": "JSON",
    },
}

EVENT_NAMES: tuple[str, ...] = tuple(EVENT_SCHEMAS)

# Manifest fields the ``runs`` view exposes, with their types.
MANIFEST_COLUMNS: dict[str, str] = {
    "run_id": "VARCHAR",
    "experiment": "VARCHAR",
    "experiment_hash": "VARCHAR",
    "status": "VARCHAR",
    "started_at": "TIMESTAMP",
    "ended_at": "TIMESTAMP",
    "seed": "BIGINT",
    "planned_sessions": "BIGINT",
    "resumes": "INTEGER",
    "roles": "JSON",
    "params": "JSON",
    "versions": "JSON",
}

RUN_STATUSES = ("running", "finished", "failed", "interrupted")

# Distributions recorded in the manifest; a missing one is recorded as null.
TRACKED_PACKAGES = (
    "askspec",
    "duckdb",
    "pyarrow",
    "pydantic",
    "lark",
    "jinja2",
    "numpy",
    "torch",
    "transformers",
    "vllm",
    "openai",
    "openrlhf",
    "sentence-transformers",
    "math-verify",
    "textual",
)


def columns(name: str) -> dict[str, str]:
    """All columns (common + specific) of event file ``name``, in file order."""
    return {**COMMON_COLUMNS, **EVENT_SCHEMAS[name]}


def events_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / EVENTS_DIR


def ndjson_path(run_dir: str | os.PathLike[str], name: str) -> Path:
    return events_dir(run_dir) / f"{name}.ndjson"


def parquet_path(run_dir: str | os.PathLike[str], name: str) -> Path:
    return events_dir(run_dir) / f"{name}.parquet"


def manifest_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / MANIFEST


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    return manifest_path(path).is_file()


def find_run_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself if it is a run dir, else its immediate child run dirs.

    Hidden entries (``.<id>.tmp`` directories of runs being created) are skipped.
    Sorted by name, which is chronological because run ids start with a timestamp.
    """
    p = Path(path)
    if is_run_dir(p):
        return [p]
    if not p.is_dir():
        return []
    return sorted(
        c for c in p.iterdir() if not c.name.startswith(".") and c.is_dir() and is_run_dir(c)
    )


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def new_run_id(experiment: str, now: float | None = None) -> str:
    """``YYYYMMDD-HHMMSS-<experiment>-<6 hex>`` in UTC, e.g. ``20261121-211500-ask_e-3f2a1c``.

    The random suffix makes ids unique in practice; ``RunWriter.create`` also
    creates the directory exclusively and retries on a collision.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    name = _UNSAFE.sub("_", experiment).strip("._-")[:48] or "run"
    return f"{stamp}-{name}-{secrets.token_hex(3)}"


def utc_iso(t: float | None = None) -> str:
    """ISO-8601 UTC with microseconds and a ``Z`` suffix."""
    t = time.time() if t is None else t
    sec = int(t)
    micro = int(round((t - sec) * 1_000_000))
    if micro == 1_000_000:
        sec, micro = sec + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{micro:06d}Z"


def package_versions() -> dict[str, str | None]:
    """Versions of Python and the tracked distributions (None when not installed)."""
    return dict(_package_versions())


@functools.lru_cache(maxsize=1)  # metadata lookups cost ~30 ms; versions do not change in-process
def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for dist in TRACKED_PACKAGES:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    if versions.get("askspec") is None:
        # Running from a source checkout (not installed): fall back to the module.
        try:
            import askspec

            versions["askspec"] = getattr(askspec, "__version__", None)
        except ImportError:
            pass
    return versions


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so readers see the old or the new file, never half.

    The temporary file lives in the same directory (``os.replace`` is only atomic
    within one file system) and is fsynced before the rename.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    data = json.dumps(obj, indent=2, ensure_ascii=False, default=str).encode("utf-8")
    try:
        with open(tmp, "wb") as f:
            f.write(data + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    with open(manifest_path(run_dir), encoding="utf-8") as f:
        return json.load(f)
