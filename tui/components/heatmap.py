"""``Heatmap``: a metric with two ``by`` keys as a grid (Ask-E's per-pair calibration
view): rows are the first key's values, columns the second's, cells coloured by value."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from askspec.terminal import printable
from askspec.tui.shaping import Heatmap as HeatmapData


def _colour(x: float) -> str:
    """Red (low) through yellow to green (high) for x in [0, 1]."""
    x = min(1.0, max(0.0, x))
    if x < 0.5:
        r, g = 220, int(60 + 320 * x)
    else:
        r, g = int(220 - 300 * (x - 0.5)), 220
    return f"#{r:02x}{g:02x}50"


def render_heatmap(h: HeatmapData) -> Table:
    vals = [v for v in h.values.values() if isinstance(v, (int, float))]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    if 0.0 <= lo and hi <= 1.0:  # a rate: colour on its own scale, not the spread seen
        lo, hi = 0.0, 1.0
    span = (hi - lo) or 1.0
    t = Table(title=f"{h.metric} by ({h.row_key}, {h.col_key})", box=None, padding=(0, 1),
              title_justify="left", title_style="bold")
    t.add_column(f"{h.row_key} \\ {h.col_key}", style="bold", no_wrap=True)
    for c in h.cols:
        t.add_column(printable(c, single_line=True)[:14], justify="center", no_wrap=True)
    for r in h.rows:
        cells: list[Text | str] = [printable(r, single_line=True)]
        for c in h.cols:
            v = h.values.get((r, c))
            if v is None:
                cells.append(Text("·", style="dim"))
            else:
                n = h.counts.get((r, c))
                cells.append(Text(f" {v:.2f} ", style=f"black on {_colour((v - lo) / span)}")
                             + Text(f" n={n}" if n is not None else "", style="dim"))
        t.add_row(*cells)
    return t


class Heatmap(Static):
    DEFAULT_CSS = "Heatmap { height: auto; margin: 0 0 1 0; }"

    def __init__(self, data: HeatmapData) -> None:
        super().__init__(render_heatmap(data))
        self.data = data
