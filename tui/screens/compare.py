"""Two runs side by side, for a researcher to trust the difference: which settings
differ (one line at the top), then sessions, outcome rates, mean reward per role and
every declared metric with n and a 95 % interval for both runs, B − A and whether the
intervals overlap; the settings each was started with (spec hash, seed, profile, ``--set``
values, models and backends, from the manifests; those that differ first, marked
``≠``); and the key training curves of both runs overlaid."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, Static

from askspec.terminal import printable
from askspec.tui import data
from askspec.tui.components.keybar import KeyBar
from askspec.tui.components.loader import Loader
from askspec.tui.components.table import ArrowTable
from askspec.tui.messages import Loaded, LoadFailed
from askspec.tui.screens.metrics import curve_grid
from askspec.tui.shaping import Comparison

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
        with VerticalScroll(id="compare-page"):
            yield Static("", id="compare-differ", classes="status")
            yield Static(Text("results (95% intervals; overlap: whether they do)", style="bold"), classes="section")
            yield ArrowTable(id="compare", empty="comparing…", max_width=70)
            yield Static(Text("settings (≠: differs)", style="bold"), classes="section")
            yield ArrowTable(id="compare-settings", empty="comparing…", max_width=70)
        yield KeyBar()

    def on_mount(self) -> None:
        src = self.app.source
        self.load("compare", data.compare, src, self.run_a, src, self.run_b)

    async def on_loaded(self, msg: Loaded) -> None:
        if msg.key == "compare":
            msg.stop()
            c: Comparison = msg.result
            differ = Text("settings: ", style="bold")
            differ.append(f"{len(c.differ)} differ ({', '.join(c.differ)}), listed below" if c.differ
                          else "the same in both runs")
            self.query_one("#compare-differ", Static).update(differ)
            settings = self.query_one("#compare-settings", ArrowTable)
            settings.styles.height = c.settings.num_rows + 2
            await settings.set_table(c.settings)
            table = self.query_one("#compare", ArrowTable)
            table.styles.height = c.results.num_rows + 2
            await table.set_table(c.results)
            page = self.query_one("#compare-page", VerticalScroll)
            if c.curves:
                await page.mount(Static(Text("training curves, A and B overlaid", style="bold"), classes="section"))
                await page.mount(curve_grid(c.curves))
            page.focus()  # (the page scrolls with PageDown; a click on a table focuses it)

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key == "compare":
            msg.stop()
            self.query_one("#compare-head", Static).update(Text(f"⚠ {msg.error}"))
