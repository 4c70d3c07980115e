"""The hf backend's prefix cache: keys/values of finished sequences, reused by later prompts.

A conversation's next prompt (a role with `memory = full`) is its previous prompt, the
reply, and a new user turn, so most of it was encoded already. When a row finishes, the
backend stores the keys/values of every token it fed (prompt + generated, the last sampled
token excepted: it was never fed) under those token ids. A new prompt looks for the entry
sharing the longest common prefix of token ids with it and prefills only the rest.

The key is the token ids themselves, not a session or role: whatever the engine sends (a
system prompt shared by many sessions, a retry, a re-tokenised reply that diverges from the
sampled ids), the reuse covers exactly the tokens that are equal, so it is correct by
construction. Keys/values at a position depend only on the tokens up to it (causal
attention, absolute positions baked in by RoPE), not on what follows.

Bounded by entries and bytes (least recently used goes first); an entry whose ids extend
another's makes that one redundant (any prompt matches the longer at least as far), so it
replaces it. Cleared when the weights change (`check_weights` with the backend's explicit
weights version, which whoever writes the served weights advances: see
HFBackend.weights_changed), on `clear()`, and when the backend closes. Thread-safe: the worker stores and looks up, other threads may clear.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

DEFAULT_ENTRIES = 64
DEFAULT_MB = 512
MIN_TOKENS = 16  # a shorter common prefix is not worth a cache copy


@dataclass(eq=False)
class PrefixEntry:
    """Keys/values of one fed sequence: per layer [kv_heads, len(ids), head_dim]."""

    ids: tuple[int, ...]
    keys: list[Any]
    values: list[Any]
    nbytes: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences (binary search on slices,
    so the comparisons run in C)."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    lo, hi = 1, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    """Least-recently-used store of PrefixEntry, bounded by `max_entries` and `max_bytes`."""

    def __init__(self, max_entries: int = DEFAULT_ENTRIES, max_bytes: int = DEFAULT_MB << 20,
                 min_tokens: int = MIN_TOKENS) -> None:
        self.max_entries = max(1, int(max_entries))
        self.max_bytes = max(0, int(max_bytes))
        self.min_tokens = max(1, int(min_tokens))
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()  # id(entry) -> entry, oldest first
        self._bytes = 0
        self._weights: Any = None  # the weights version the entries were computed under
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(self, ids: Sequence[int]) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the longest prefix with `ids` and how many tokens of it to
        reuse: at most len(ids) - 1 (the last prompt token is always fed, for its logits),
        at least `min_tokens`; (None, 0) when nothing qualifies."""
        ids = tuple(ids)
        with self._lock:
            best, best_n = None, 0
            for entry in self._entries.values():
                n = common_prefix(entry.ids, ids)
                if n > best_n:
                    best, best_n = entry, n
            best_n = min(best_n, len(ids) - 1)
            if best is None or best_n < self.min_tokens:
                self.misses += 1
                return None, 0
            self._entries.move_to_end(id(best))
            self.hits += 1
            return best, best_n

    def store(self, ids: Sequence[int], keys: list[Any], values: list[Any]) -> bool:
        """Keep keys/values for `ids`; returns False when the entry alone exceeds the byte
        bound (or is too short to be reused)."""
        ids = tuple(ids)
        nbytes = sum(int(t.numel()) * t.element_size() for t in (*keys, *values))
        if len(ids) < self.min_tokens or nbytes > self.max_bytes:
            return False
        entry = PrefixEntry(ids, keys, values, nbytes)
        with self._lock:
            for key, old in list(self._entries.items()):
                if len(old.ids) <= len(ids) and ids[: len(old.ids)] == old.ids:
                    self._drop(key)  # the new entry covers every prefix the old one did
            self._entries[id(entry)] = entry
            self._bytes += nbytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
                self.evictions += 1
        return True

    def check_weights(self, version: Any) -> None:
        """Clear every entry when the weights version differs from the one they were
        computed under. The version is explicit (HFBackend.weights_changed), never read from
        torch's tensor internals: a fused optimizer writes parameters in place without
        bumping their version counters."""
        with self._lock:
            if version != self._weights:
                self._clear()
                self._weights = version

    def clear(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.nbytes
