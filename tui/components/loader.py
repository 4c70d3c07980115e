"""``Loader``: the one way widgets call the data layer — in a thread worker, never on
the UI thread; the result comes back as a ``Loaded``/``LoadFailed`` message.

Per key at most one load runs and one waits: asking again while a load runs replaces
the waiting one, which starts when the running one ends. Results arrive in the order
they were asked for, and a refresh that takes longer than the follow-mode tick still
finishes (cancelling it for the next tick, as an exclusive worker would, meant a slow
query under load never showed anything)."""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any, Callable

from textual.worker import get_current_worker

from askspec.tui.components.guard import Guarded
from askspec.tui.data import DataError
from askspec.tui.messages import Loaded, LoadFailed
from askspec.tui.source import one_line


class Loader(Guarded):
    """Mixin for widgets and screens (anything with ``run_worker``/``post_message``);
    their handlers' errors are shown, not fatal (``Guarded``)."""

    # set on first use (a mixin has no __init__ of its own to set them in)
    _loader_lock: threading.Lock
    _loader_queued: dict[str, tuple | None]

    def _loader_state(self) -> tuple[threading.Lock, dict[str, tuple | None]]:
        try:
            return self._loader_lock, self._loader_queued
        except AttributeError:
            self._loader_lock, self._loader_queued = threading.Lock(), {}
            return self._loader_lock, self._loader_queued

    def load(self, key: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in a thread (after the load running under ``key``, if any)."""
        lock, queued = self._loader_state()
        with lock:
            if key in queued:  # one is running: this one waits (replacing any waiting)
                queued[key] = (fn, args)
                return
            queued[key] = None
        self.run_worker(  # type: ignore[attr-defined]
            partial(self._load_in_thread, key, fn, args), thread=True, exit_on_error=False,
            group=f"load:{id(self)}:{key}", name=f"load {key}",
        )

    def _load_in_thread(self, key: str, fn: Callable[..., Any], args: tuple) -> None:
        worker = get_current_worker()
        lock, queued = self._loader_state()
        released = False
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    msg: Loaded | LoadFailed = Loaded(key, fn(*args), time.perf_counter() - t0)
                except DataError as e:
                    msg = LoadFailed(key, str(e))
                except Exception as e:  # a bug or an unexpected store state: say it, keep running
                    msg = LoadFailed(key, f"{type(e).__name__}: {one_line(e)}")
                if worker.is_cancelled:  # the widget went away
                    return
                self.post_message(msg)  # type: ignore[attr-defined]  # thread-safe
                with lock:
                    nxt = queued.get(key)
                    if nxt is None:
                        queued.pop(key, None)
                        released = True
                        return
                    queued[key] = None
                fn, args = nxt
        finally:
            if not released:
                with lock:
                    queued.pop(key, None)
