"""Messages between the TUI's workers, widgets and screens (all in one place).

Workers never touch widgets: a query's result arrives as ``Loaded`` (or ``LoadFailed``
with a one-line reason) on the widget that asked, tagged with the key it was asked under
so a handler can tell its queries apart. ``StoreChanged`` is the follow-mode tick: the
app posts it to the active screen when a run's files grew.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message


class Loaded(Message):
    """A worker's query finished; ``result`` is what the data function returned."""

    def __init__(self, key: str, result: Any, seconds: float) -> None:
        super().__init__()
        self.key = key
        self.result = result
        self.seconds = seconds


class LoadFailed(Message):
    """A worker's query failed; ``error`` is one line for the user."""

    def __init__(self, key: str, error: str) -> None:
        super().__init__()
        self.key = key
        self.error = error


class StoreChanged(Message, bubble=False):
    """Files under the opened path changed (follow mode); screens reload what they show.

    It does not bubble: a screen hands it to its panes, and a pane's copy going back up
    to the screen would be handed down again, without end."""


class OpenRun(Message):
    """Open a run (from the runs table or the command palette)."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class OpenSession(Message):
    """Open a session's transcript."""

    def __init__(self, run_id: str, session_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.session_id = session_id
