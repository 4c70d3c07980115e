"""Is a run's process still there? The one place that decides the status a run is shown
with (``askspec runs``, the ``runs`` view that ``askspec query`` and the TUI read).

A manifest says ``running`` from the moment its process starts until it calls
``finish``; a process killed with ``kill -9``, or whose machine went down, never does.
So each process records in its history entry (``manifest.history[-1]``) its ``pid``,
its ``host`` and a ``heartbeat_at`` the writer renews every ``HEARTBEAT_S`` seconds
(writer.py, from a thread of its own, so a long training step does not stop it).
A run whose manifest says ``running`` is shown as

- ``crashed`` when its process is gone: recorded on this host (or on an older version
  that did not record its host) and no process of that pid exists here;
- ``stale`` when it cannot be checked and has not been heard from: recorded on another
  host with a heartbeat older than ``STALE_S`` (or a process of that pid exists here,
  but the run's heartbeat stopped: the pid was reused, or the process hangs);
- ``running`` otherwise.

``--resume`` continues a crashed or stale run (a live one is refused by the writer lock).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import socket
import time
from typing import Any

# Seconds between heartbeats, and the silence after which a run on another host is stale.
# (The environment variables are for tests: a heartbeat every 30 s is cheap, waiting one is not.)
HEARTBEAT_S = float(os.environ.get("ASKSPEC_HEARTBEAT_S") or 30.0)
STALE_S = float(os.environ.get("ASKSPEC_STALE_S") or 10 * HEARTBEAT_S)

# The statuses a run is shown with: the manifest's (layout.RUN_STATUSES) and these two.
SHOWN_STATUSES = ("running", "finished", "failed", "interrupted", "crashed", "stale")
NOT_RUNNING = ("crashed", "stale")


def host() -> str:
    """This machine's name, as recorded with each process of a run."""
    return socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A process that has died but was not yet reaped (a killed run's, until its parent or
    init collects it): it still answers kill(pid, 0). Linux's /proc says so; elsewhere no."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # the state follows the command name, which is in parentheses and may hold anything
    return stat[stat.rfind(b")") + 2: stat.rfind(b")") + 3] == b"Z"


def seconds(ts: Any) -> float | None:
    """Seconds since the epoch of an ISO-8601 UTC time (the manifest's), None if it is not one."""
    if not isinstance(ts, str):
        return None
    try:
        t = _dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t.timestamp()


def last_sign_of_life(process: dict[str, Any]) -> str | None:
    """The latest time a process's history entry shows it alive: its heartbeat, else its start."""
    beats = [t for t in (process.get("heartbeat_at"), process.get("started_at")) if seconds(t) is not None]
    return max(beats, key=lambda t: seconds(t) or 0.0) if beats else None


def shown_status(status: Any, process: Any, now: float | None = None) -> str | None:
    """The status to show for a run whose manifest says ``status`` and whose latest
    process's history entry is ``process`` (see the module docstring)."""
    if status != "running" or not isinstance(process, dict):
        return status if isinstance(status, str) else None
    now = time.time() if now is None else now
    seen = seconds(last_sign_of_life(process))
    silent = seen is not None and now - seen > STALE_S
    where = process.get("host")
    pid = process.get("pid")
    if where is None or where == host():
        if isinstance(pid, int) and not isinstance(pid, bool) and not pid_alive(pid):
            return "crashed"
        # alive (or no pid recorded): only a run that records heartbeats can tell a reused pid
        # or a hung process
        return "stale" if silent and "heartbeat_at" in process else "running"
    return "stale" if silent or seen is None else "running"


def shown_status_of(manifest: dict[str, Any], now: float | None = None) -> str | None:
    history = manifest.get("history")
    last = history[-1] if isinstance(history, list) and history else None
    return shown_status(manifest.get("status"), last, now)


def _sql_status(status: str | None, last: str | None) -> str | None:
    """The ``runs`` view's status: the manifest's status and its last history entry (JSON)."""
    if status != "running":
        return status
    try:
        process = json.loads(last) if last else None
    except ValueError:
        process = None
    return shown_status(status, process)


SQL_FUNCTION = "askspec_run_status"


def register(con: Any) -> None:
    """Define ``askspec_run_status(status, last_history_entry)`` on a DuckDB connection (the
    ``runs`` view's status; evaluated at each query, so a long-lived reader sees a run's
    process die)."""
    from duckdb.sqltypes import VARCHAR

    con.create_function(SQL_FUNCTION, _sql_status, [VARCHAR, VARCHAR], VARCHAR, null_handling="special",
                        side_effects=True)


def process_seconds(process: dict[str, Any], now: float | None = None, live: bool = False) -> float | None:
    """Seconds one process of a run ran: to its end, or (none recorded) to now while it
    runs, else to its last sign of life."""
    start = seconds(process.get("started_at"))
    if start is None:
        return None
    end = seconds(process.get("ended_at"))
    if end is None:
        end = (time.time() if now is None else now) if live else seconds(last_sign_of_life(process))
    return max(0.0, (end or start) - start)


def run_seconds(history: Any, live: bool = False, now: float | None = None) -> float | None:
    """Seconds a run's processes ran, all of them (pauses between resumes left out); the
    latest one to now when ``live``."""
    if not isinstance(history, list):
        return None
    total, seen = 0.0, False
    for i, process in enumerate(history):
        if not isinstance(process, dict):
            continue
        s = process_seconds(process, now, live and i == len(history) - 1)
        if s is not None:
            total += s
            seen = True
    return round(total, 3) if seen else None


def shown_status_of_file(path: str | os.PathLike[str]) -> str | None:
    """The shown status of the run whose manifest is at ``path`` (None if it cannot be
    read): for a poller (the TUI's follow mode), which sees a run's process die although
    none of its files changes. The manifest is parsed again only when it changed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    status, last = _recorded(os.fspath(path), st.st_mtime_ns, st.st_size)
    return _sql_status(status, last)


@functools.lru_cache(maxsize=256)
def _recorded(path: str, mtime_ns: int, size: int) -> tuple[str | None, str | None]:
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        history = manifest.get("history")
        last = history[-1] if isinstance(history, list) and history else None
        return manifest.get("status"), json.dumps(last) if isinstance(last, dict) else None
    except (OSError, ValueError, AttributeError):
        return None, None
