"""``ErrorPanel``: an exception that escaped a screen, a handler or a worker, shown over
the screen it happened on (the app's ``_handle_exception`` sends it here and goes on).

Its text is the error's type, message and where it was raised, as plain ``Text`` (never
markup: the message may quote data); the full traceback is in the log."""

from __future__ import annotations

import traceback

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from askspec.terminal import printable


def describe(error: BaseException) -> Text:
    """The error in a few lines: ``Type: message`` and the frame that raised it."""
    cause = getattr(error, "error", None)  # a worker's failure wraps the worker's exception
    if isinstance(cause, BaseException):
        error = cause
    message = printable(str(error).strip() or "(no message)", single_line=True)
    text = Text(f"{type(error).__name__}: ", style="bold")
    text.append(message[:500] + ("…" if len(message) > 500 else ""))
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        last = frames[-1]
        text.append(f"\nin {last.name} ({last.filename}:{last.lineno})", style="dim")
    return text


class ErrorPanel(ModalScreen[None]):
    """The last unexpected error (and how many there were since the panel opened)."""

    DEFAULT_CSS = """
    ErrorPanel { align: center middle; background: $background 60%; }
    ErrorPanel > Vertical { width: 90%; max-width: 110; height: auto; border: thick $error;
                            background: $surface; padding: 1 2; }
    ErrorPanel #error-title { text-style: bold; color: $error; }
    ErrorPanel #error-text { margin: 1 0; }
    ErrorPanel #error-hint { color: $text-muted; }
    """
    BINDINGS = [Binding("escape", "dismiss", "Close"), Binding("enter", "dismiss", "Close", show=False)]

    def __init__(self, error: Text, log_path: str | None) -> None:
        super().__init__()
        self.error = error
        self.log_path = log_path
        self.count = 1

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("⚠ unexpected error — the app goes on", id="error-title")
            yield Static(self.error, id="error-text")
            yield Static(self._hint(), id="error-hint")

    def _hint(self) -> Text:
        where = f"the traceback is in {self.log_path}" if self.log_path else "the traceback is in the log"
        more = f"{self.count} errors since this panel opened; the last is shown. " if self.count > 1 else ""
        return Text(f"{more}{where}. esc closes this panel (please report the error).")

    def show(self, error: Text) -> None:
        """Another error while the panel is up: it shows the newest and counts them."""
        self.error = error
        self.count += 1
        if self.is_mounted:
            self.query_one("#error-text", Static).update(error)
            self.query_one("#error-hint", Static).update(self._hint())
