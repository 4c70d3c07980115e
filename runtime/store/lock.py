"""The advisory single-writer lock of a run directory: one process appends to a run at a
time (a writer, a resume, or compaction); the kernel releases it if the process dies."""

from __future__ import annotations

import os
from pathlib import Path

from askspec.runtime.store import layout

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".writer.lock"


class RunLockedError(RuntimeError):
    """Another live process holds this run's writer lock."""


def acquire_writer_lock(run_dir: Path) -> int | None:
    if fcntl is None:  # pragma: no cover
        return None
    layout.events_dir(run_dir).mkdir(exist_ok=True)
    fd = os.open(layout.events_dir(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunLockedError(f"run {run_dir} is being written by another process") from None
    return fd


def release_writer_lock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the descriptor drops the flock
