"""The sessions table's column choice, remembered per spec.

Which columns are hidden and whether the token columns (a scan of the turns) are shown,
kept per experiment name in ``$XDG_STATE_HOME/askspec/tui-columns.json`` (default
``~/.local/state/askspec/``): a run of the same spec opens with the same columns. Written
only when the choice changes; a missing or unreadable file is the default choice."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

# never hidden: the table's rows are keyed (and opened) by it
KEY_COLUMN = "session"
MAX_SPECS = 200  # experiments remembered (the oldest choices are forgotten)


def state_dir() -> Path:
    """``$XDG_STATE_HOME/askspec``, else ``~/.local/state/askspec``."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "askspec"


def prefs_file() -> Path:
    return state_dir() / "tui-columns.json"


@dataclass
class ColumnChoice:
    hidden: set[str] = field(default_factory=set)
    tokens: bool = False  # the ``ROLE in`` / ``ROLE out`` columns


def _read() -> dict:
    try:
        data = json.loads(prefs_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load(experiment: str | None) -> ColumnChoice:
    entry = _read().get(experiment or "")
    if not isinstance(entry, dict):
        return ColumnChoice()
    hidden = entry.get("hidden")
    return ColumnChoice(hidden={str(h) for h in hidden if h != KEY_COLUMN} if isinstance(hidden, list) else set(),
                        tokens=entry.get("tokens") is True)


def save(experiment: str | None, choice: ColumnChoice) -> str | None:
    """Remember ``choice`` for the experiment; None, or why it could not be written."""
    data = _read()
    data.pop(experiment or "", None)  # (re-inserted last: the most recent choices are kept)
    data[experiment or ""] = {"hidden": sorted(choice.hidden), "tokens": choice.tokens}
    while len(data) > MAX_SPECS:
        data.pop(next(iter(data)))
    target = prefs_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, target)  # (whole or not at all: two apps may write it)
    except OSError as e:
        return f"could not remember the columns in {target}: {e.strerror or e}"
    return None
