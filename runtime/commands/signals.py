"""Ctrl-C and SIGTERM during a run: stop promptly, keep everything recorded so far.

The first signal cancels the run's task: sessions in flight stop at their next await
and the run ends as `interrupted`. The engine and the backends that never wait let the
event loop run every few ms (backends/loop.py), so this works even when no model call
ever waits (replay, async python callables; synchronous ones run on a worker thread). If the loop still has not stopped after `grace` seconds (a callable that
blocks it), or on a second signal, KeyboardInterrupt is raised in the main thread, in
whatever is running; the command records the run as `interrupted` all the same.
"""

from __future__ import annotations

import _thread
import asyncio
import signal
import threading
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """`with StopOnSignal(task):` installs the handlers; `signalled` tells whether a signal came."""

    def __init__(self, task: asyncio.Future, grace: float = 2.0) -> None:
        self.task = task
        self.loop = asyncio.get_running_loop()
        self.grace = grace
        self.signalled = 0
        self._previous: dict[int, Any] = {}
        self._stop = threading.Event()

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread
        for sig in SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except (ValueError, OSError):  # not settable here (an embedding host)
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        self.signalled += 1
        if self.signalled > 1:
            raise KeyboardInterrupt
        try:
            self.loop.call_soon_threadsafe(self.task.cancel)
        except RuntimeError:  # the loop is already closed
            raise KeyboardInterrupt from None
        threading.Thread(target=self._watchdog, name="askspec-stop-watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        # The loop did not get to the cancellation: something holds it. Interrupt the main
        # thread (this calls _handle again, which raises KeyboardInterrupt there).
        if not self._stop.wait(self.grace) and not self.task.done():
            _thread.interrupt_main(signal.SIGINT)
