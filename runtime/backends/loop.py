"""Letting the event loop run, cheaply: `let_loop_run()` for code that never waits.

A backend that has its answer at hand (replay, an async python callable) and the
engine between sessions never wait on anything, so without a deliberate yield a run
would never let the loop handle Ctrl-C (the signal handler only schedules the run's
cancellation on the loop), a timer or another session. Yielding on every call costs a
trip through the loop's scheduler each time; yielding when the loop has not run for
`INTERVAL` seconds keeps Ctrl-C prompt (a few ms) at a fraction of that cost.
"""

from __future__ import annotations

import asyncio
import time

INTERVAL = 0.002  # seconds the loop may go without a turn (0: yield on every call)

_due = 0.0  # time.monotonic() after which the next call yields


def loop_due() -> bool:
    """Whether `let_loop_run()` would yield now: a caller on a hot path tests this and
    awaits only then, sparing the coroutine of the call."""
    return time.monotonic() >= _due


async def let_loop_run() -> None:
    """Yield to the event loop if `INTERVAL` has passed since the last yield here."""
    global _due
    now = time.monotonic()
    if now >= _due:
        _due = now + INTERVAL
        await asyncio.sleep(0)
