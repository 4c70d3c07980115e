"""``LineIndex``: where each session's lines are in a growing NDJSON event file.

Opening a transcript must not make DuckDB parse all of ``turns.ndjson`` (1.1 GB for a
1M-turn run): the index maps each session id to the byte offsets of its lines, so a
transcript is a few seeks and reads. It is built by one pass over the file (in a worker,
once per run opened), extended by reading only what was appended since, and rebuilt
when the file was replaced or shrank (a resume that moved a damaged line out rewrites
it). Only complete lines are indexed: a torn or half-written last line waits for its
newline.

The pass looks for the first ``"session_id":`` of each line: the writer puts the
session id before any nested object, and a string value cannot contain that text
unescaped. A line found at an offset is checked before use (``lines``), so a stale
offset makes the index start over instead of showing another session's turns.

Nothing here imports Textual or DuckDB.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

KEY = b'"session_id":'
_BLANK = b" \t"
CHUNK = 1 << 24  # bytes read per step of a pass


def _string_end(buf: bytes, start: int, end: int) -> int:
    """Index of the quote closing the JSON string whose body starts at ``start`` (-1 if
    not within ``end``): a quote preceded by an odd number of backslashes is escaped."""
    j = buf.find(b'"', start, end)
    while j > 0:
        k = j
        while buf[k - 1] == 0x5C:  # backslash
            k -= 1
        if (j - k) % 2 == 0:
            return j
        j = buf.find(b'"', j + 1, end)
    return j


def _decode(raw: bytes) -> bytes:
    """The session id as UTF-8 (JSON escapes resolved), the index's key."""
    if b"\\" not in raw:
        return raw
    try:
        return json.loads(b'"' + raw + b'"').encode()
    except ValueError:
        return raw


class LineIndex:
    """Byte offsets of the lines of one NDJSON event file, by session id (thread-safe)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._offsets: dict[bytes, list[int]] = {}
        self._end = 0  # bytes indexed; always just after a newline
        self._ident: tuple[int, int] | None = None  # (device, inode) of the file indexed
        self.size = 0  # the file's size when last looked at (for progress)

    @property
    def indexed(self) -> int:
        return self._end

    def update(self) -> None:
        """Index whatever was appended since the last call (the whole file the first time)."""
        with self._lock:
            self._update()

    def _reset(self, ident: tuple[int, int] | None) -> None:
        self._offsets = {}
        self._end = 0
        self._ident = ident

    def _update(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._reset(None)
            self.size = 0
            return
        ident = (st.st_dev, st.st_ino)
        if ident != self._ident or st.st_size < self._end:
            self._reset(ident)
        self.size = st.st_size
        if st.st_size == self._end:
            return
        with open(self.path, "rb") as f:
            f.seek(self._end)
            carry = b""
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                buf = carry + chunk
                cut = buf.rfind(b"\n") + 1
                if cut:
                    self._scan(buf, cut, self._end)
                    self._end += cut
                carry = buf[cut:]
                time.sleep(0)  # let the UI thread have the interpreter between chunks

    def _scan(self, buf: bytes, end: int, base: int) -> None:
        # The hot loop of a pass (1M lines for a 1M-turn run): C-level finds only, the
        # rare escaped id on a slow path. A later key on a line already seen (a nested
        # "session_id") is skipped; a malformed line may give a wrong id, which
        # ``lines`` catches.
        find, rfind = buf.find, buf.rfind
        offsets = self._offsets
        k = len(KEY)
        pos = 0
        last = -1
        while True:
            i = find(KEY, pos, end)
            if i < 0:
                return
            start = rfind(b"\n", 0, i) + 1  # the line the key is on
            q = i + k
            while q < end and buf[q] in _BLANK:  # '"session_id": "..."' from other writers
                q += 1
            pos = q
            if q >= end or buf[q] != 0x22 or start == last:  # not a string, or not the line's first
                continue
            j = find(b'"', q + 1, end)
            if j < 0:
                return
            if buf[j - 1] == 0x5C:  # an escaped quote or backslash in the id
                j = _string_end(buf, q + 1, end)
                if j < 0:
                    return
            pos = j + 1
            last = start
            sid = buf[q + 1:j]
            if 0x5C in sid:
                sid = _decode(sid)
            lst = offsets.get(sid)
            if lst is None:
                offsets[sid] = [base + start]
            else:
                lst.append(base + start)

    def lines(self, session_id: str) -> list[bytes]:
        """The complete lines of ``session_id``, in file order (indexing what is new first)."""
        key = session_id.encode()
        for _ in range(2):
            with self._lock:
                self._update()
                offsets = list(self._offsets.get(key, ()))
                out = self._read(offsets, key)
                if out is not None:
                    return out
                self._reset(None)  # an offset no longer points at this session's line
        return []

    def _read(self, offsets: list[int], key: bytes) -> list[bytes] | None:
        out = []
        try:
            with open(self.path, "rb") as f:
                for o in offsets:
                    f.seek(o)
                    line = f.readline()
                    i = line.find(KEY)
                    if not line.endswith(b"\n") or i < 0:
                        return None
                    q = i + len(KEY)
                    while q < len(line) and line[q] in _BLANK:
                        q += 1
                    j = _string_end(line, q + 1, len(line)) if line[q:q + 1] == b'"' else -1
                    if j < 0 or _decode(line[q + 1:j]) != key:
                        return None
                    out.append(line)
        except OSError:
            return None
        return out
