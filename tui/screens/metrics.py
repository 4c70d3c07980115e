"""The metrics tab: the spec's ``metric`` declarations as tables (by their ``by`` keys),
two-key metrics as heatmaps (Ask-E's per-pair calibration view), and curves of the
``train_steps`` columns over steps once training records exist."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static
from textual_plotext import PlotextPlot

from askspec.terminal import printable
from askspec.tui import data
from askspec.tui.components.heatmap import Heatmap
from askspec.tui.components.loader import Loader
from askspec.tui.components.table import ArrowTable
from askspec.tui.messages import Loaded, LoadFailed, StoreChanged
from askspec.tui.shaping import Metrics

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp
    from askspec.tui.screens.run import RunScreen


class TrainPlot(PlotextPlot):
    DEFAULT_CSS = "TrainPlot { height: 14; margin: 0 0 1 0; }"

    def __init__(self, role: str, column: str, points: list[tuple[int, float]]) -> None:
        super().__init__()
        self.role, self.column, self.points = role, column, points

    def on_mount(self) -> None:
        plt = self.plt
        plt.title(f"{self.role}: {self.column} over steps")
        plt.xlabel("step")
        xs = [p[0] for p in self.points]
        ys = [p[1] for p in self.points]
        if len(xs) == 1:
            plt.scatter(xs, ys)
        else:
            plt.plot(xs, ys, marker="braille")
        if len(set(xs)) <= 12:  # steps are whole numbers: label them, not plotext's fractions between
            plt.xticks(sorted(set(xs)))


def _same(a: Metrics, b: Metrics) -> bool:
    """Whether two results would show the same thing."""
    return (a.note == b.note and a.errors == b.errors and a.train == b.train
            and a.tables.keys() == b.tables.keys() and all(a.tables[k].equals(b.tables[k]) for k in a.tables))


class MetricsPane(Loader, VerticalScroll):
    app: AskspecApp  # the app this runs in (textual types it App[Any])
    screen: RunScreen  # the run screen holding this pane (textual types it Screen[object])

    def __init__(self, run_id: str) -> None:
        super().__init__(id="metrics-pane")
        self.run_id = run_id
        self.result: Metrics | None = None

    def compose(self) -> ComposeResult:
        yield Static("loading metrics…", id="metrics-note", classes="status")

    def reload(self) -> None:
        self.load("metrics", data.metrics, self.app.source, self.run_id)

    @on(StoreChanged)
    def _changed(self) -> None:
        if self.screen.live:
            self.reload()

    async def on_loaded(self, msg: Loaded) -> None:
        if msg.key != "metrics":
            return
        msg.stop()
        m: Metrics = msg.result
        if self.result is not None and _same(self.result, m):
            return  # a follow-mode tick that changed nothing shown here
        self.result = m
        keep_y = self.scroll_y
        for w in list(self.children)[1:]:
            await w.remove()
        notes = []
        if m.note:
            notes.append(m.note)
        if m.errors:
            notes.append(f"{m.errors} session(s) ended in error and are excluded")
        if m.tables:
            notes.append(f"{len(m.tables)} declared metric(s)")
        self.query_one("#metrics-note", Static).update(Text("  ·  ".join(notes)))
        widgets: list[Widget] = []
        heatmaps = {h.metric: h for h in m.heatmaps}
        for name, table in m.tables.items():
            widgets.append(Static(Text(printable(name, single_line=True), style="bold"), classes="section"))
            t = ArrowTable(classes="metric-table", max_width=40)
            widgets.append(t)
            t.styles.height = min(table.num_rows + 2, 12)
            if name in heatmaps:
                widgets.append(Heatmap(heatmaps[name]))
        if m.train:
            widgets.append(Static(Text("training", style="bold"), classes="section"))
            for role, series in m.train.items():
                for column, points in series.items():
                    widgets.append(TrainPlot(role, column, points))
        else:
            widgets.append(Static("no training records (train_steps) in this run", classes="status"))
        await self.mount_all(widgets)
        for t, table in zip(self.query(".metric-table").results(ArrowTable), m.tables.values()):
            await t.set_table(table)
        if keep_y:
            self.call_after_refresh(self.scroll_to, y=keep_y, animate=False)

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key == "metrics":
            msg.stop()
            self.query_one("#metrics-note", Static).update(Text(f"⚠ {msg.error}", style="bold red"))
