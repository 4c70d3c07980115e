"""A full-screen message for a path the TUI cannot open (missing, not a directory)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Center, Middle
from textual.screen import Screen
from textual.widgets import Header, Static

from askspec.terminal import printable
from askspec.tui.components.guard import Guarded
from askspec.tui.components.keybar import KeyBar


class MessageScreen(Guarded, Screen):
    BINDINGS = [Binding("q", "app.quit", "Quit"), Binding("escape", "app.quit", "Quit", show=False)]

    def __init__(self, message: str, hint: str) -> None:
        super().__init__()
        self.message, self.hint = message, hint

    def compose(self) -> ComposeResult:
        yield Header()
        with Middle():
            with Center():
                text = Text(f"⚠ {printable(self.message, single_line=True)}\n", style="bold")
                text.append(self.hint, style="")
                yield Static(text, id="message")
        yield KeyBar()
