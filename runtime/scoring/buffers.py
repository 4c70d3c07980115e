"""The engine's buffer type: a spec `buffer` filled by `push` and replayed by games that
iterate over it (PasoDoble's offline question buffer, papers/pasodoble.txt §3.6), with the
eviction policies of App. D.

The engine adds a phase's pushes once the phase has ended, in session order, so a
buffer's contents never depend on scheduling. `items` is the list expressions read (the
same object for the buffer's whole life); `ids` runs parallel to it: each pushed item gets
the next number, so an item keeps its id while older ones leave.

Eviction:
- `oldest` — only when full: the oldest item leaves to make room (reason `capacity`);
- `none` — a full buffer keeps what it has and the new item is refused (`rejected`);
- `solved` — after a replay whose score (the replaying game's `score` variable, the
  accuracy) reached 1;
- `no_peak` — after `patience` replays in a row without a new best score (the best
  starts at the item's `best_field` when the buffer names one, PasoDoble's prev_acc = p_i;
  else the first replay sets it);
- `solved_or_no_peak` — either.
The score-based policies also make room like `oldest` when the buffer is full.

Every change is reported to `on_event(event)` (a dict: buffer, event = push | evict |
rejected | replay, item, value, reason, score, best, replays), which the engine writes to
the run store's `buffer_events`.
"""

from __future__ import annotations

from typing import Any, Callable

EVICTIONS = ("oldest", "none", "solved", "no_peak", "solved_or_no_peak")
SCORED = ("solved", "no_peak", "solved_or_no_peak")  # need the replaying game's score


class ReplayBuffer:
    def __init__(self, name: str, capacity: int, eviction: str = "oldest", patience: int = 3,
                 on_event: Callable[[dict], None] | None = None, best_field: str | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"buffer {name}: capacity must be >= 1")
        if eviction not in EVICTIONS:
            raise ValueError(f"buffer {name}: unknown eviction {eviction!r} (one of {', '.join(EVICTIONS)})")
        self.name = name
        self.capacity = capacity
        self.eviction = eviction
        self.patience = patience
        self.best_field = best_field  # an item's field its best score starts from (else its first replay's)
        self.on_event = on_event
        self.items: list[Any] = []
        self.ids: list[int] = []
        self.next_id = 0
        self.cursor = 0  # circular replay: position of the next item to replay
        self.stats: dict[int, dict[str, Any]] = {}  # id -> {replays, best, since_best, score}

    def __len__(self) -> int:
        return len(self.items)

    def _emit(self, event: str, item_id: int, value: Any, **extra: Any) -> None:
        if self.on_event is not None:
            st = self.stats.get(item_id, {})
            self.on_event({"buffer": self.name, "event": event, "item": item_id, "value": value,
                           "replays": st.get("replays", 0), "best": st.get("best"), **extra})

    def add(self, item: Any) -> bool:
        """Add one pushed item; False when the buffer is full and may not evict."""
        if len(self.items) >= self.capacity and not self._make_room():
            self._emit("rejected", self.next_id, item, reason="full")
            self.next_id += 1
            return False
        item_id = self.next_id
        self.next_id += 1
        self.items.append(item)
        self.ids.append(item_id)
        best = item.get(self.best_field) if self.best_field and isinstance(item, dict) else None
        self.stats[item_id] = {"replays": 0, "best": None if best is None else float(best), "since_best": 0}
        self._emit("push", item_id, item)
        return True

    def _make_room(self) -> bool:
        """Free one slot of a full buffer; False when nothing may be evicted."""
        if self.eviction == "none":
            return False  # full and nothing may be evicted: the new item is not kept
        self._remove(0, "capacity")
        return True

    def _remove(self, pos: int, reason: str, **extra: Any) -> None:
        item_id, value = self.ids[pos], self.items[pos]
        self._emit("evict", item_id, value, reason=reason, **extra)
        del self.items[pos]
        del self.ids[pos]
        self.stats.pop(item_id, None)
        if pos < self.cursor:
            self.cursor -= 1
        if self.cursor >= len(self.items):
            self.cursor = 0

    def next_batch(self, count: int) -> list[tuple[int, Any]]:
        """Up to `count` (id, item) pairs in circular order from the cursor, no item twice
        in one batch; advances the cursor. [] when the buffer is empty."""
        out = []
        for _ in range(min(count, len(self.items))):
            if self.cursor >= len(self.items):
                self.cursor = 0
            out.append((self.ids[self.cursor], self.items[self.cursor]))
            self.cursor = (self.cursor + 1) % len(self.items)
        return out

    def replayed(self, item_id: int, score: float | None) -> str | None:
        """Record one replay of item `item_id` with the replaying game's score (None when
        the buffer has no `score`); returns the eviction reason if the item left."""
        if item_id not in self.stats:
            return None  # left already (evicted for room while its replay was played)
        st = self.stats[item_id]
        st["replays"] += 1
        if score is not None:
            score = float(score)
            st["score"] = score
            if st["best"] is None or score > st["best"]:
                st["best"], st["since_best"] = score, 0
            else:
                st["since_best"] += 1
        self._emit("replay", item_id, None, score=score)
        if score is None or self.eviction not in SCORED:
            return None
        reason = None
        if self.eviction in ("solved", "solved_or_no_peak") and score >= 1.0:
            reason = "solved"
        elif self.eviction in ("no_peak", "solved_or_no_peak") and st["since_best"] >= self.patience:
            reason = "no_peak"
        if reason is not None:
            self._remove(self.ids.index(item_id), reason, score=score)
        return reason

    # -- checkpoints: a schedule's buffer persists across phases and resumes -------------

    def state(self) -> dict[str, Any]:
        return {"items": list(self.items), "ids": list(self.ids), "next_id": self.next_id, "cursor": self.cursor,
                "stats": {str(k): dict(v) for k, v in self.stats.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self.items[:] = state["items"]  # the same list object: expressions hold it
        self.ids[:] = state["ids"]
        self.next_id, self.cursor = int(state["next_id"]), int(state["cursor"])
        self.stats = {int(k): dict(v) for k, v in state["stats"].items()}
