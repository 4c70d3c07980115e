"""Reference buffers (test oracles): a generic ring buffer and PasoDoble's offline
question buffer with the paper's eviction rules. The engine's own buffer type is
`askspec.runtime.scoring.buffers.ReplayBuffer`; eviction by solve rate (the rules below)
is to be added there with the schedules work, checked against this reference.

PasoDoble offline training (papers/pasodoble.txt §3.6, Algorithm 2, App. D):
questions with tau_low < p < 1 from the proposer phase enter the buffer as
(q, a*, used = 0, prev_acc = p); the solver phase replays the buffer sequentially and
circularly ("We loop over B in a circular fashion"). Optional eviction (App. D): evict a
question when (1) the solver achieves 100% accuracy on it, or (2) its pass rate has not
risen above its peak in the last c = 3 attempts. An empty buffer ends the solver phase
early. The paper's main results use no eviction (App. D Table 7: eviction hurt).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from paper_rewards import PASODOBLE_TAU_LOW

T = TypeVar("T")


class RingBuffer(Generic[T]):
    """Fixed-capacity FIFO: appending to a full buffer evicts the oldest item."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._items: list[T | None] = [None] * capacity
        self._head = 0  # slot of the oldest item
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def full(self) -> bool:
        return self._len == self.capacity

    def append(self, item: T) -> T | None:
        """Append; return the evicted oldest item when the buffer was full, else None."""
        if self._len < self.capacity:
            self._items[(self._head + self._len) % self.capacity] = item
            self._len += 1
            return None
        evicted = self._items[self._head]
        self._items[self._head] = item
        self._head = (self._head + 1) % self.capacity
        return evicted

    def __iter__(self) -> Iterator[T]:
        """Oldest to newest."""
        for k in range(self._len):
            yield self._items[(self._head + k) % self.capacity]  # type: ignore[misc]

    def __getitem__(self, k: int) -> T:
        if k < 0:
            k += self._len
        if not 0 <= k < self._len:
            raise IndexError("ring buffer index out of range")
        return self._items[(self._head + k) % self.capacity]  # type: ignore[return-value]

    def oldest(self) -> T:
        return self[0]

    def newest(self) -> T:
        return self[-1]

    def clear(self) -> None:
        self._items = [None] * self.capacity
        self._head = self._len = 0


@dataclass(frozen=True)
class ValidityFilter:
    """PasoDoble's validity thresholds (§3.3-3.5, tau_low = 0.2)."""

    tau_low: float = PASODOBLE_TAU_LOW

    def valid(self, p: float) -> bool:
        """A question is valid iff p > tau_low (the proposer is rewarded only then)."""
        return p > self.tau_low

    def retain(self, p: float) -> bool:
        """The solver trains / the buffer stores iff tau_low < p < 1 (p = 1 has no signal)."""
        return self.tau_low < p < 1.0

    __call__ = retain


@dataclass(frozen=True)
class EvictionRule:
    """App. D eviction: solver accuracy >= ``solved`` (100%), or no new peak in ``c`` attempts."""

    c: int = 3
    solved: float = 1.0


@dataclass
class BufferedQuestion:
    id: int
    question: str
    answer: str
    prev_acc: float          # pass rate when it entered the buffer (Alg. 2 line 19)
    used: int = 0            # replays so far
    peak: float = 0.0        # best pass rate seen, starting at prev_acc
    since_peak: int = 0      # replays since the peak last rose
    last_acc: float | None = None


class BufferEmpty(LookupError):
    """Raised by ``next()`` on an empty buffer: the solver phase stops early (App. D)."""


class QuestionBuffer:
    """PasoDoble's offline question buffer with circular replay and optional eviction.

    ``capacity`` (None = unbounded, as in the paper) drops the oldest question when full.
    ``eviction`` is an ``EvictionRule`` (or True for the App. D rule with c = 3), or None
    for the paper's default of no eviction. ``record(id, accuracy)`` reports a replay's
    solver pass rate and applies the rule.
    """

    def __init__(self, capacity: int | None = None, eviction: EvictionRule | bool | None = None):
        if capacity is not None and capacity < 1:
            raise ValueError("capacity must be >= 1 or None")
        self.capacity = capacity
        self.eviction = EvictionRule() if eviction is True else (eviction or None)
        self._items: list[BufferedQuestion] = []
        self._cursor = 0  # index of the next item to replay
        self._next_id = 0
        self.evicted: list[tuple[int, str]] = []  # (id, reason) log for the run store

    def __len__(self) -> int:
        return len(self._items)

    @property
    def empty(self) -> bool:
        return not self._items

    def __iter__(self) -> Iterator[BufferedQuestion]:
        return iter(list(self._items))

    def add(self, question: str, answer: str, pass_rate: float) -> BufferedQuestion:
        """Store a question (callers filter with ``ValidityFilter.retain`` first)."""
        item = BufferedQuestion(id=self._next_id, question=question, answer=answer,
                                prev_acc=pass_rate, peak=pass_rate)
        self._next_id += 1
        self._items.append(item)
        if self.capacity is not None and len(self._items) > self.capacity:
            self._remove_at(0, "capacity")
        return item

    def _remove_at(self, idx: int, reason: str) -> None:
        item = self._items.pop(idx)
        self.evicted.append((item.id, reason))
        if idx < self._cursor:
            self._cursor -= 1
        if self._cursor >= len(self._items):
            self._cursor = 0

    def next(self) -> BufferedQuestion:
        """The next question in circular order."""
        if not self._items:
            raise BufferEmpty("question buffer is empty")
        if self._cursor >= len(self._items):
            self._cursor = 0
        item = self._items[self._cursor]
        self._cursor = (self._cursor + 1) % len(self._items)
        return item

    def next_batch(self, size: int) -> list[BufferedQuestion]:
        """Up to ``size`` consecutive questions in circular order, without repeats within
        one batch (a batch is capped at the buffer's length); [] when empty."""
        return [self.next() for _ in range(min(size, len(self._items)))]

    def record(self, item_id: int, accuracy: float) -> bool:
        """Record a replay's pass rate; return True if the question was evicted."""
        idx = next((k for k, it in enumerate(self._items) if it.id == item_id), None)
        if idx is None:
            raise KeyError(f"question {item_id} is not in the buffer")
        item = self._items[idx]
        item.used += 1
        item.last_acc = accuracy
        if accuracy > item.peak:
            item.peak = accuracy
            item.since_peak = 0
        else:
            item.since_peak += 1
        rule = self.eviction
        if rule is None:
            return False
        if accuracy >= rule.solved:
            self._remove_at(idx, "solved")
            return True
        if item.since_peak >= rule.c:
            self._remove_at(idx, "no_new_peak")
            return True
        return False


__all__ = ["RingBuffer", "ValidityFilter", "EvictionRule", "BufferedQuestion", "BufferEmpty",
           "QuestionBuffer"]
