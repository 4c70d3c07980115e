"""The engine's buffer type: a spec `buffer` filled by `push` and replayed by games that
iterate over it (PasoDoble's offline question buffer, papers/pasodoble.txt §3.6).

The engine adds a phase's pushes once the phase has ended, in session order, so a
buffer's contents never depend on scheduling. `items` is the list expressions read (the
same object for the buffer's whole life). Capacity is enforced here; which item leaves a
full buffer is the eviction policy (`_make_room`). The score-based policies of the paper
(`solved`, `no_peak`, App. D) need the replaying games' accuracy per item and belong to
the schedules work; until then they drop the oldest item, like `oldest`.
"""

from __future__ import annotations

from typing import Any


class ReplayBuffer:
    def __init__(self, name: str, capacity: int, eviction: str = "oldest") -> None:
        if capacity < 1:
            raise ValueError(f"buffer {name}: capacity must be >= 1")
        self.name = name
        self.capacity = capacity
        self.eviction = eviction
        self.items: list[Any] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: Any) -> bool:
        """Add one pushed item; False when the buffer is full and may not evict."""
        if len(self.items) >= self.capacity and not self._make_room():
            return False
        self.items.append(item)
        return True

    def _make_room(self) -> bool:
        """Free one slot of a full buffer; False when nothing may be evicted."""
        if self.eviction == "none":
            return False  # full and nothing may be evicted: the new item is not kept
        del self.items[0]  # oldest out
        return True
