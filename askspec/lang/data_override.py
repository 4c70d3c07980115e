"""`--data NAME=FILE`: a user's own file in place of a data block's, read once at check
time (a regular file no larger than a spec's data files may be, ``read_regular``) and
checked record by record against the fields the block declares, so that a missing or
mistyped field is a diagnostic naming the field and the file rather than a failure in the
middle of a run. The file is the user's, named on the command line: unlike a spec's own
data paths it need not lie inside the spec's folder."""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .paths import MAX_DATA_BYTES, MAX_RECORD_BYTES, FileRefused, read_parquet_rows, read_regular, record_too_large
from .types import ANY, T, from_json_value, list_of, TYPE_NAMES

# fields a knowledge() block's records have, declared or not (askspec.lang.blocks.data_item_type)
KNOWLEDGE_FIELDS = {"text": "string"}


@dataclass
class DataFile:
    """A --data file as read: its absolute path, format, content digest, and what is wrong
    with it (each a sentence): `unreadable` (the file itself), `problems` (its records
    against the block's fields). Both empty: the file fits the block."""

    path: str
    format: str
    digest: str | None = None
    unreadable: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def file_format(path: str, block_format: str) -> str:
    """The format a --data file is read in: parquet by its extension, else JSON lines (a
    knowledge block's passages stay knowledge)."""
    if path.lower().endswith(".parquet"):
        return "parquet"
    return "knowledge" if block_format == "knowledge" else "jsonl"


def read_data_file(given: str, block_format: str, declared: dict[str, str] | None) -> DataFile:
    """Read ``given`` (a path as the user wrote it) and check its records against
    ``declared`` (field -> type name; None: the block declares none, only the records'
    shape is checked)."""
    path = os.path.abspath(given)
    out = DataFile(path, file_format(path, block_format))
    try:
        data = read_regular(path, MAX_DATA_BYTES, shown=given)
    except FileRefused as e:
        out.unreadable.append(f"refused: {e}")
        return out
    except FileNotFoundError:
        out.unreadable.append(f"no such file: {path}")
        return out
    except OSError as e:
        out.unreadable.append(f"cannot read {given}: {e.strerror or e}")
        return out
    out.digest = hashlib.sha256(data).hexdigest()
    try:
        records = _records(data, out.format, given)
    except ValueError as e:
        out.unreadable.append(str(e))
        return out
    if not records:
        out.unreadable.append(f"{given} holds no records")
        return out
    out.problems += check_records(records, declared, given)
    return out


def _records(data: bytes, fmt: str, shown: str) -> list[tuple[int, Any]]:
    """(line or row number, record) pairs; ValueError for a line that is not JSON."""
    if fmt == "parquet":
        return list(enumerate(read_parquet_rows(io.BytesIO(data), shown), 1))
    out = []
    for n, raw in enumerate(data.split(b"\n"), 1):
        if len(raw) + 1 > MAX_RECORD_BYTES:
            raise ValueError(f"{shown}:{n}: {record_too_large(len(raw) + 1)}")
        line = raw.strip()
        if not line:
            continue
        try:
            out.append((n, json.loads(line)))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            why = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
            raise ValueError(f"{shown}:{n}: invalid JSON line ({why}); a data file has one JSON record a line") from None
    return out


def check_records(records: list[tuple[int, Any]], declared: dict[str, str] | None, shown: str) -> list[str]:
    """One sentence per declared field some record lacks or holds a value of another type
    in (the first such record), and for a record that is not a JSON object."""
    problems: list[str] = []
    missing: dict[str, int] = {}
    mistyped: dict[str, tuple[int, T]] = {}
    types = {k: _type(v) for k, v in (declared or {}).items()}
    for n, rec in records:
        if not isinstance(rec, dict):
            problems.append(f"{shown}:{n}: a record is a JSON object with the block's fields, found {type(rec).__name__}")
            break
        for k, want in types.items():
            if k not in rec:
                missing.setdefault(k, n)
            elif k not in mistyped and rec[k] is not None and _differs(want, from_json_value(rec[k])):
                mistyped[k] = (n, from_json_value(rec[k]))
    for k, n in missing.items():
        problems.append(f"{shown}:{n}: the record has no field '{k}'")
    for k, (n, got) in mistyped.items():
        problems.append(f"{shown}:{n}: field '{k}' is {got}, the block declares {declared[k]}")  # type: ignore[index]
    return problems


def _type(name: str) -> T:
    return list_of(ANY) if name == "list" else TYPE_NAMES.get(name, ANY)


def _differs(want: T, got: T) -> bool:
    if "any" in (want.name, got.name):
        return False
    return want.name != got.name
