"""Two runs side by side: sessions, outcome rates, mean reward per role and every
declared metric, with the difference (e.g. two checkpoints' evaluation runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Static

from askspec.terminal import printable
from askspec.tui import data
from askspec.tui.components.keybar import KeyBar
from askspec.tui.components.loader import Loader
from askspec.tui.components.table import ArrowTable
from askspec.tui.messages import Loaded, LoadFailed

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp


class CompareScreen(Loader, Screen):
    app: AskspecApp  # the app this runs in (textual types it App[Any])

    BINDINGS = [Binding("escape", "app.back", "Back")]

    def __init__(self, run_a: str, run_b: str) -> None:
        super().__init__()
        self.run_a, self.run_b = run_a, run_b

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text(f"A: {printable(self.run_a, single_line=True)}\nB: {printable(self.run_b, single_line=True)}"),
                     id="compare-head", classes="bar")
        yield ArrowTable(id="compare", empty="comparing…", max_width=70)
        yield KeyBar()

    def on_mount(self) -> None:
        src = self.app.source
        self.load("compare", data.compare, src, self.run_a, src, self.run_b)

    async def on_loaded(self, msg: Loaded) -> None:
        if msg.key == "compare":
            msg.stop()
            table = self.query_one("#compare", ArrowTable)
            await table.set_table(msg.result)
            table.focus_table()

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key == "compare":
            msg.stop()
            self.query_one("#compare-head", Static).update(Text(f"⚠ {msg.error}"))
