"""Strings too long to store inline: moved to side files, their first characters kept.

One misbehaving server (a 20 MB reply) must not make an event line so long that
DuckDB refuses to read the file. When an encoded event exceeds ``LINE_CHARS``, the
writer calls ``shrink``: every string in the event (top-level field or nested in a
JSON value) longer than a threshold is replaced by its first ``PREVIEW_CHARS``
characters, and the whole string goes to ``events/overflow/<sha256>.txt`` (UTF-8;
identical strings share a file). Thresholds step down (64 Ki, 4 Ki, 256 chars) until
the line fits; as a last resort a whole JSON-valued field moves to a ``.json`` file.

The event then carries ``overflow``: one record per moved value,
``{"path": "$.text", "chars": 20971520, "file": "overflow/<sha256>.txt", "sha256": ...}``
(``"json": true`` for a moved JSON value, which is replaced by null). Paths use
DuckDB's JSON path syntax, e.g. ``$.prompt[3].content``. ``read_overflow`` gives the
full value back. Side files are written (and fsynced) before the event line that
refers to them, so a line never points to a missing file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable

from askspec.runtime.store import layout

LINE_CHARS = 1 << 20  # an encoded event longer than this is shrunk (<= 4 MiB of UTF-8)
THRESHOLDS = (1 << 16, 1 << 12, 1 << 8)
PREVIEW_CHARS = THRESHOLDS[-1]  # a preview is never cut again by a lower threshold
_JSON_FIELDS = ("prompt", "parsed", "params", "vars", "stats", "metrics", "members")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _key_path(path: str, key: Any) -> str:
    key = str(key)
    return f"{path}.{key}" if _IDENT.fullmatch(key) else f"{path}.{json.dumps(key)}"


def _store(events_dir: Path, data: bytes, suffix: str) -> tuple[str, str]:
    digest = hashlib.sha256(data).hexdigest()
    rel = f"{layout.OVERFLOW_DIR}/{digest}{suffix}"
    target = events_dir / rel
    if not target.exists():
        target.parent.mkdir(exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return rel, digest


def _cut(value: Any, path: str, limit: int, events_dir: Path, records: list[dict]) -> Any:
    """``value`` with every string longer than ``limit`` cut (copies only what changes)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        rel, digest = _store(events_dir, value.encode("utf-8", "replace"), ".txt")
        records.append({"path": path, "chars": len(value), "file": rel, "sha256": digest})
        return value[: min(PREVIEW_CHARS, limit)]
    if isinstance(value, dict):
        out = None
        for k, v in value.items():
            nv = _cut(v, _key_path(path, k), limit, events_dir, records)
            if nv is not v:
                if out is None:
                    out = dict(value)
                out[k] = nv
        return value if out is None else out
    if isinstance(value, (list, tuple)):
        out_l = None
        for i, v in enumerate(value):
            nv = _cut(v, f"{path}[{i}]", limit, events_dir, records)
            if nv is not v:
                if out_l is None:
                    out_l = list(value)
                out_l[i] = nv
        return value if out_l is None else out_l
    return value


def shrink(event: dict[str, Any], events_dir: Path, encode: Callable[[Any], str]) -> str:
    """``event`` encoded in at most LINE_CHARS characters (see the module docstring)."""
    records: list[dict] = list(event.get("overflow") or [])
    body = encode(event)
    for limit in THRESHOLDS:
        if len(body) <= LINE_CHARS:
            return body
        cut: dict[str, Any] = {}
        for k, v in event.items():
            cut[k] = v if k in ("ts", "run_id", "gen", "overflow") else _cut(v, _key_path("$", k), limit, events_dir,
                                                                               records)
        cut["overflow"] = records
        event = cut
        body = encode(event)
    for k in _JSON_FIELDS:
        if len(body) <= LINE_CHARS:
            break
        if event.get(k) is not None:
            rel, digest = _store(events_dir, encode(event[k]).encode("utf-8", "replace"), ".json")
            records.append({"path": f"$.{k}", "json": True, "file": rel, "sha256": digest})
            event = {**event, k: None, "overflow": records}
            body = encode(event)
    return body


def read_overflow(run_dir: str | os.PathLike[str], record: dict[str, Any]) -> Any:
    """The full value an ``overflow`` record stands for (a string, or a JSON value)."""
    rel = str(record["file"])
    if not re.fullmatch(rf"{layout.OVERFLOW_DIR}/[0-9a-f]{{64}}\.(txt|json)", rel):
        raise ValueError(f"not an overflow file: {rel!r}")
    data = (layout.events_dir(run_dir) / rel).read_bytes()
    return json.loads(data) if record.get("json") else data.decode("utf-8")
