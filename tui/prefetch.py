"""``TranscriptCache``: transcripts read (and laid out) ahead, kept in a small LRU.

While the cursor rests on a row of the sessions table, that session's transcript is
fetched in a worker (``SessionsScreen`` asks through its ``Loader``: one fetch runs, one
waits, and a newer row replaces the waiting one, so moving the cursor drops the fetch of
the row it left before it starts). Enter then shows a fetched transcript at once; one
still being fetched is waited for in the transcript screen's worker, not fetched twice.

Thread-safe: fetches run in worker threads, the UI thread only looks up."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable

SIZE = 16  # transcripts kept (a few MB at most: the turns' texts and their wrapped lines)


class TranscriptCache:
    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._done: OrderedDict[Hashable, Any] = OrderedDict()
        self._running: dict[Hashable, threading.Event] = {}

    def get(self, key: Hashable) -> Any | None:
        """The fetched value of ``key``, or None (never waits)."""
        with self._lock:
            value = self._done.get(key)
            if value is not None:
                self._done.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._done[key] = value
            self._done.move_to_end(key)
            while len(self._done) > self.size:
                self._done.popitem(last=False)

    def fetch(self, key: Hashable, fn: Callable[..., Any], *args: Any, fresh: bool = False) -> Any:
        """``fn(*args)``, kept under ``key`` (call it in a worker thread). A value already
        fetched is returned unless ``fresh``; a fetch of ``key`` already running is waited
        for instead of run twice."""
        while True:
            with self._lock:
                if not fresh and key in self._done:
                    self._done.move_to_end(key)
                    return self._done[key]
                running = self._running.get(key)
                if running is None:
                    mine = self._running[key] = threading.Event()
                    break
            running.wait()  # then take its value (or, if it failed or ``fresh``, fetch again)
        try:
            value = fn(*args)
            self.put(key, value)
            return value
        finally:
            with self._lock:
                self._running.pop(key, None)
            mine.set()
