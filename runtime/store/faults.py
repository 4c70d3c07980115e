"""Fault injection for the tests of what a crash leaves behind: with
``ASKSPEC_KILL_AT_MANIFEST_WRITE=N`` in its environment, a process kills itself with
SIGKILL at its Nth write of a run's manifest, just before that write becomes visible
(``RunWriter``: the run directory's rename when it is created, each atomic rewrite of
``manifest.json`` after). Killing before write N is killing after write N-1, so N = 1,
2, ... covers every point between the writes of the start-up sequence, with no race.

Unset (always, outside tests), it costs one comparison per manifest write."""

from __future__ import annotations

import os
import signal

ENV = "ASKSPEC_KILL_AT_MANIFEST_WRITE"
_kill_at = int(os.environ.get(ENV) or 0)
_writes = 0


def manifest_write() -> None:
    """Called by the writer before each manifest write takes effect."""
    global _writes
    if not _kill_at:
        return
    _writes += 1
    if _writes == _kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
