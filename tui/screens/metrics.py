"""The metrics tab, a dashboard: the key training curves first, in a grid (reward mean
± std per role, loss, KL, grad norm, share of zero advantages, tokens per second), then
the spec's declared metrics as one table with n and a 95 % interval (two-key metrics
also as heatmaps: Ask-E's per-pair calibration view), then — behind ``b`` — the
trainer's other series (step bookkeeping, policy version, timings, ...)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult, RenderResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.widget import Widget
from textual.widgets import Static
from textual_plotext import PlotextPlot

from askspec.terminal import printable
from askspec.tui import data
from askspec.tui.components.heatmap import Heatmap
from askspec.tui.components.loader import Loader
from askspec.tui.components.table import ArrowTable
from askspec.tui.messages import Loaded, LoadFailed, StoreChanged
from askspec.tui.shaping import Curve, Metrics, curves

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp
    from askspec.tui.screens.run import RunScreen


# The largest magnitude plotted: plotext computes spans and ticks in floats and turns
# them into integers, so two values near 1e308 (a span past the largest float) raise
# OverflowError on every render, and past about 1e20 its tick labels (written out in
# full) leave no room for the curve. A value past this is drawn at it, the title saying so.
PLOT_LIMIT = 1e15


Lines = list[tuple[str, list[tuple[int, float]]]]


def plottable(lines: Lines) -> tuple[Lines, str]:
    """``lines`` as plotext can draw them: a non-finite point left out, a finite one past
    ±PLOT_LIMIT drawn at it; and what was changed, for the title ("" when nothing)."""
    out, clamped, skipped = [], 0, 0
    for label, points in lines:
        kept = []
        for x, y in points:
            if not (math.isfinite(x) and math.isfinite(y)):
                skipped += 1
            elif abs(y) > PLOT_LIMIT:
                clamped += 1
                kept.append((x, math.copysign(PLOT_LIMIT, y)))
            else:
                kept.append((x, y))
        out.append((label, kept))
    said = []
    if clamped:
        said.append(f"{clamped} value{'s' if clamped != 1 else ''} past ±{PLOT_LIMIT:g} drawn at it")
    if skipped:
        said.append(f"{skipped} non-finite value{'s' if skipped != 1 else ''} not drawn")
    return out, "; ".join(said)


class TrainPlot(PlotextPlot):
    """One curve (or several: a band, two runs) over training steps."""

    DEFAULT_CSS = "TrainPlot { height: 12; }"

    def __init__(self, curve: Curve) -> None:
        super().__init__()
        self.curve = curve
        self.lines, self.changed = plottable(curve.lines)

    def on_mount(self) -> None:
        plt = self.plt
        # (the pane's note says what was changed: a long title is not drawn at all)
        plt.title(f"{self.curve.title} (clamped)" if self.changed else self.curve.title)
        xs_all: set[int] = set()
        for label, points in self.lines:
            if not points:
                continue
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            xs_all.update(xs)
            if len(xs) == 1:
                plt.scatter(xs, ys, label=label if len(self.curve.lines) > 1 else None)
            else:
                plt.plot(xs, ys, marker="braille", label=label if len(self.curve.lines) > 1 else None)
        if len(xs_all) <= 12:  # steps are whole numbers: label them, not plotext's fractions between
            plt.xticks(sorted(xs_all))

    def render(self) -> RenderResult:
        # a plot plotext cannot draw says so in its place: an exception here would come
        # back on every repaint, and the app would answer no key
        try:
            return super().render()
        except (ArithmeticError, ValueError, IndexError) as e:
            return Text(f"{self.curve.title}: cannot draw this plot ({type(e).__name__}: {e})", style="bold red")


def curve_grid(items: list[Curve], id: str | None = None) -> Grid:
    grid = Grid(*(TrainPlot(c) for c in items), classes="curve-grid", id=id)
    return grid


def _same(a: Metrics, b: Metrics) -> bool:
    """Whether two results would show the same thing."""
    return (a.note == b.note and a.errors == b.errors and a.train == b.train and a.intervals == b.intervals
            and a.tables.keys() == b.tables.keys() and all(a.tables[k].equals(b.tables[k]) for k in a.tables))


class MetricsPane(Loader, VerticalScroll):
    app: AskspecApp  # the app this runs in (textual types it App[Any])
    screen: RunScreen  # the run screen holding this pane (textual types it Screen[object])

    BINDINGS = [Binding("b", "bookkeeping", "Other series")]

    def __init__(self, run_id: str) -> None:
        super().__init__(id="metrics-pane")
        self.run_id = run_id
        self.result: Metrics | None = None
        self.show_other = False

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
        key, other = curves(m.train), curves(m.train, key=False)
        changed = [f"{c.title}: {said}" for c in (*key, *other) if (said := plottable(c.lines)[1])]
        if changed:
            notes.append("; ".join(changed))
            self.query_one("#metrics-note", Static).update(Text("  ·  ".join(notes)))
        if key:
            widgets.append(Static(Text("training", style="bold"), classes="section"))
            widgets.append(curve_grid(key))
        elif not m.train:
            widgets.append(Static("no training records (train_steps) in this run", classes="status"))
        table = None
        if m.declared is not None:
            widgets.append(Static(Text("declared metrics (95% interval: Wilson for a rate, t for a mean, "
                                       "else a bootstrap over sessions)", style="bold"), classes="section"))
            table = ArrowTable(id="declared", max_width=50)
            table.styles.height = min(m.declared.num_rows + 2, 16)
            widgets.append(table)
        for h in m.heatmaps:
            widgets.append(Static(Text(printable(h.metric, single_line=True), style="bold"), classes="section"))
            widgets.append(Heatmap(h))
        if other:
            widgets.append(Static(Text(f"other series ({len(other)}: step bookkeeping, timings, ...): "
                                       "press b to " + ("hide" if self.show_other else "show")),
                                  id="other-title", classes="section"))
            grid = curve_grid(other, id="other-curves")
            grid.display = self.show_other
            widgets.append(grid)
        await self.mount_all(widgets)
        if table is not None and m.declared is not None:
            await table.set_table(m.declared)
        if keep_y:
            self.call_after_refresh(self.scroll_to, y=keep_y, animate=False)

    def action_bookkeeping(self) -> None:
        self.show_other = not self.show_other
        for grid in self.query("#other-curves"):
            grid.display = self.show_other
        for title in self.query("#other-title").results(Static):
            n = len(self.query_one("#other-curves").children)
            title.update(Text(f"other series ({n}: step bookkeeping, timings, ...): press b to "
                              + ("hide" if self.show_other else "show")))

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key == "metrics":
            msg.stop()
            self.query_one("#metrics-note", Static).update(Text(f"⚠ {msg.error}", style="bold red"))
