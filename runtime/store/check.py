"""Damaged event lines: finding them, and moving them out of the way without losing them.

A line of ``events/<name>.ndjson`` is *damaged* when it is not one JSON object, lacks
a required column (``layout.required``), or holds a value of the wrong type for its
column (a string where a number belongs, ``NaN``, a list for a VARCHAR ...). The
writer never produces one; they come from torn writes (a crash mid-append), disk
faults and hand edits.

Readers (the views) skip damaged lines: DuckDB turns an unparseable line into an
all-NULL row and a mistyped value into NULL, and the views drop rows missing a
required column. A resume (the one operation that rewrites a run) calls
``quarantine_damaged``, which moves each damaged line, byte for byte, to
``events/quarantine.ndjson`` with its file, line number, byte offset and reason,
then rewrites the event file without it (atomically). Nothing is lost and later
readers see a clean file.

The scan parses every line in Python (about 1 s per 100 MB); ``file_stamp`` lets
a resume skip files that are exactly as their last writer closed them.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from askspec.runtime.store import layout

_INT32 = 1 << 31
_INT64 = 1 << 63


def _bigint(v: Any) -> bool:
    return type(v) is int and -_INT64 <= v < _INT64


def _integer(v: Any) -> bool:
    return type(v) is int and -_INT32 <= v < _INT32


def _double(v: Any) -> bool:
    return type(v) is float or (type(v) is int and -_INT64 <= v < _INT64)


def _varchar(v: Any) -> bool:
    return type(v) is str


def _timestamp(v: Any) -> bool:
    return type(v) is str and layout._TIMESTAMP.fullmatch(v) is not None


def _json(v: Any) -> bool:
    return True


def _varchar_list(v: Any) -> bool:
    return type(v) is list and all(x is None or type(x) is str for x in v)


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "BIGINT": _bigint,
    "INTEGER": _integer,
    "DOUBLE": _double,
    "VARCHAR": _varchar,
    "TIMESTAMP": _timestamp,
    "JSON": _json,
    "VARCHAR[]": _varchar_list,
}
_WANT = {"BIGINT": "an integer", "INTEGER": "a 32-bit integer", "DOUBLE": "a number", "VARCHAR": "a string",
         "TIMESTAMP": "an ISO-8601 time string", "VARCHAR[]": "a list of strings"}


# NaN and Infinity are accepted, as the writer writes them for non-finite floats
# and DuckDB reads them.
_decode = json.JSONDecoder().decode


@dataclass(frozen=True)
class BadLine:
    """A damaged line: 1-based line number, byte offset and length (newline excluded)."""

    file: str
    line: int
    offset: int
    length: int
    reason: str
    torn: bool = False  # the file's last line, without a newline (an interrupted write)

    def where(self) -> str:
        return f"events/{self.file}:{self.line}"


def _object(v: Any) -> bool:
    return type(v) is dict


# JSON columns the writer always fills with an object (readers index into them).
_OBJECT_COLUMNS = frozenset({"params", "vars", "parsed", "stats", "metrics", "bookkeeping"})
_WANT["object"] = "a JSON object"


def _checks_for(name: str) -> tuple[tuple[str, Callable[[Any], bool], str], ...]:
    cols = layout.columns(name)
    return tuple((c, _object, "object") if c in _OBJECT_COLUMNS else (c, _CHECKS[t], t) for c, t in cols.items())


def line_problem(name: str, raw: bytes, checks=None) -> str | None:
    """Why ``raw`` (one line of events/<name>.ndjson, no newline) is damaged, or None."""
    try:
        ev = _decode(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (byte {e.start})"
    except ValueError as e:
        return f"not JSON ({getattr(e, 'msg', e)})"
    except RecursionError:
        return "nested too deeply to read"
    if type(ev) is not dict:
        return f"not a JSON object ({layout._type_name(ev)})"
    for col in layout.required(name):
        if ev.get(col) is None:
            return f"'{col}' is missing"
    for col, ok, typ in checks or _checks_for(name):
        v = ev.get(col)
        if v is not None and not ok(v):
            return f"'{col}' must be {_WANT.get(typ, typ)}, not {layout._type_name(v)} {layout._short(v)}"
    if name == "sessions" and ev["event"] not in ("started", "finished"):
        return f"'event' must be started or finished, not {layout._short(ev['event'])}"
    if name == "rewards" and ev["kind"] not in ("turn", "terminal"):
        return f"'kind' must be turn or terminal, not {layout._short(ev['kind'])}"
    return None


def scan_file(path: Path, name: str) -> list[BadLine]:
    """Every damaged line of ``path`` (an events/<name>.ndjson file), in file order."""
    bad: list[BadLine] = []
    checks = _checks_for(name)
    offset = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            torn = not raw.endswith(b"\n")
            body = raw.rstrip(b"\r\n") if not torn else raw
            if body.strip():
                why = line_problem(name, body, checks)
                if why is not None:
                    if torn:
                        why = f"partial last line (interrupted write): {why}"
                    bad.append(BadLine(path.name, number, offset, len(body), why, torn))
            offset += len(raw)
    return bad


def file_stamp(path: Path) -> list[int] | None:
    """(size, mtime in ns) of ``path``: a writer records it at finish; equal later = untouched."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _raw_field(data: bytes) -> dict[str, str]:
    try:
        return {"raw": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"raw_base64": base64.b64encode(data).decode("ascii")}


def quarantine_damaged(run_dir: Path, name: str, bad: list[BadLine], *, gen: int, ts: str) -> None:
    """Move the ``bad`` lines of events/<name>.ndjson to events/quarantine.ndjson.

    Order makes a crash at any point lose nothing: the quarantine records are
    written and fsynced first, then the event file is rewritten without those
    lines under a temporary name, fsynced and renamed over the original. (A crash
    in between leaves the lines in both places; the next resume moves them again.)
    """
    if not bad:
        return
    path = layout.ndjson_path(run_dir, name)
    by_offset = {b.offset: b for b in bad}
    records = []
    with open(path, "rb") as f:
        for b in bad:
            f.seek(b.offset)
            data = f.read(b.length)
            records.append(json.dumps({"ts": ts, "gen": gen, "file": b.file, "line": b.line, "offset": b.offset,
                                       "reason": b.reason, **_raw_field(data)}, ensure_ascii=False) + "\n")
    qpath = layout.events_dir(run_dir) / layout.QUARANTINE
    fd = os.open(qpath, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        layout.write_all(fd, "".join(records).encode("utf-8", "surrogatepass"))
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            offset = 0
            for raw in src:
                if offset not in by_offset:
                    dst.write(raw if raw.endswith(b"\n") else raw + b"\n")
                offset += len(raw)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
