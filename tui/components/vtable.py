"""``VirtualTable``: an Arrow table drawn with Textual's Line API, one visible row at a time.

A run's sessions table can hold 100k rows; drawing costs only what is on screen. The
rows stay in the Arrow table; a line on screen is fetched by index (in blocks of
``BLOCK`` rows, formatted once into strings), laid out from the column widths measured
ahead (``measure``, in the worker that fetched the rows) and kept as a ``Strip`` until
the data, the style or the cursor's row changes. Nothing here walks every row on the UI
thread: replacing the data is a reference swap.

Keys: up/down, page up/down, home/end move the row cursor (the view follows it),
left/right scroll sideways, enter chooses the row. Mouse: a click moves the cursor, a
click on the cursor's row chooses it, a click on a header names its column, the wheel
scrolls."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from askspec.tui.components.guard import Guarded
from askspec.tui.numbers import number

BLOCK = 64  # rows fetched from Arrow and formatted at a time
NULL = "-"
ELLIPSIS = "…"


def cell_text(value: Any) -> str | None:
    """How a cell shows ``value`` (one line; strings come escaped from the data layer);
    None for a null (drawn as ``NULL``, centred)."""
    if value is None:
        return None
    if isinstance(value, str):
        if "\n" in value or "\r" in value:  # a row is one line (the data layer escapes these)
            return value.splitlines()[0] + ELLIPSIS if value.strip() else ""
        return value
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (float, Decimal)):
        return number(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (datetime, time)):
        return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return str(value)
    return str(value)


def _right_aligned(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
            or pa.types.is_temporal(t) or pa.types.is_boolean(t))


def _content_width(col: pa.ChunkedArray) -> int:
    """The widest cell of ``col`` as ``cell_text`` shows it (vectorised where it can be:
    a 100k-row column is measured in milliseconds)."""
    if len(col) == 0 or col.null_count == len(col):
        return len(NULL)
    t = col.type
    width = len(NULL) if col.null_count else 0
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        # code points, not cells: a wide character may be cut with "…" instead of the
        # column growing (rare in a run's ids and labels)
        return max(width, pc.max(pc.utf8_length(col)).as_py() or 0)
    if pa.types.is_integer(t):
        lo, hi = pc.min_max(col).values()
        return max(width, len(str(lo.as_py())), len(str(hi.as_py())))
    if pa.types.is_boolean(t):
        return max(width, 5)
    # floats (``number``: its length is not monotonic in the value) and the rest: each
    # distinct value as shown
    return max(width, *(len(str(cell_text(v))) for v in pc.unique(col).to_pylist() if v is not None))


@dataclass(frozen=True)
class TableLayout:
    """Column widths (content, before capping) and alignments of one Arrow table."""

    widths: tuple[int, ...]
    right: tuple[bool, ...]


def measure(table: pa.Table) -> TableLayout:
    """The layout of ``table`` (call it in a worker thread: it scans every column)."""
    return TableLayout(tuple(_content_width(c) for c in table.columns),
                       tuple(_right_aligned(c.type) for c in table.columns))


def _fit(text: str | None, width: int, right: bool) -> str:
    if text is None:
        return NULL.center(width)
    n = cell_len(text)
    if n > width:
        return set_cell_size(text, width - 1) + ELLIPSIS if width > 1 else set_cell_size(text, width)
    pad = " " * (width - n)
    return pad + text if right else text + pad


class VirtualTable(Guarded, ScrollView, can_focus=True):
    """A row-cursor table over an Arrow table (see the module docstring)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "vtable--header", "vtable--cursor", "vtable--cursor-blurred", "vtable--hover",
    }
    DEFAULT_CSS = """
    VirtualTable { background: $surface; color: $foreground; height: 1fr; }
    VirtualTable:focus { background-tint: $foreground 5%; }
    VirtualTable > .vtable--header { text-style: bold; background: $panel; color: $foreground; }
    VirtualTable > .vtable--cursor { background: $block-cursor-background; color: $block-cursor-foreground;
                                     text-style: $block-cursor-text-style; }
    VirtualTable > .vtable--cursor-blurred { background: $block-cursor-blurred-background;
                                             color: $block-cursor-blurred-foreground; }
    VirtualTable > .vtable--hover { background: $block-hover-background; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select", "Select", show=False),
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "first", "First row", show=False),
        Binding("end", "last", "Last row", show=False),
        Binding("left", "sideways(-1)", "Left", show=False),
        Binding("right", "sideways(1)", "Right", show=False),
    ]

    class RowMessage(Message):
        def __init__(self, table: "VirtualTable", row: int) -> None:
            super().__init__()
            self.table = table
            self.row = row

    class RowHighlighted(RowMessage):
        """The cursor moved to a row."""

    class RowSelected(RowMessage):
        """Enter, or a click on the cursor's row."""

    class HeaderSelected(Message):
        def __init__(self, table: "VirtualTable", column: int) -> None:
            super().__init__()
            self.table = table
            self.column = column

    def __init__(self, table: pa.Table, layout: TableLayout | None = None, *, max_width: int = 60,
                 cursor_row: int = 0, id: str | None = None) -> None:
        super().__init__(id=id)
        self.max_width = max_width
        self.cursor_row = cursor_row
        self.hover_row: int | None = None
        self._data = table
        self._rows: dict[int, list[tuple[str | None, ...]]] = {}  # block -> formatted rows
        self._strips: dict[tuple, Strip] = {}
        self._styles: dict[str, Style] = {}
        self._follow_cursor = cursor_row > 0  # scroll the cursor into view once laid out
        self.set_data(table, layout)

    # ------------------------------------------------------------------ data

    @property
    def row_count(self) -> int:
        return self._data.num_rows

    def set_data(self, table: pa.Table, layout: TableLayout | None = None) -> None:
        """Show ``table`` (``layout`` measured ahead, else measured now); the cursor keeps
        its index, clamped."""
        layout = layout or measure(table)
        self._data = table
        names = [str(cell_text(n)) for n in table.column_names]
        self._names = names
        self._right = layout.right
        self._widths = [min(max(w, cell_len(n)), self.max_width) for w, n in zip(layout.widths, names)]
        self._rows.clear()
        self._strips.clear()
        self.virtual_size = Size(sum(w + 2 for w in self._widths), table.num_rows + 1)
        self.cursor_row = max(0, min(self.cursor_row, table.num_rows - 1))
        self.refresh()

    def _cells(self, row: int) -> tuple[str | None, ...]:
        block = row // BLOCK
        rows = self._rows.get(block)
        if rows is None:
            if len(self._rows) > 256:
                self._rows.clear()
            cols = self._data.slice(block * BLOCK, BLOCK).to_pydict().values()
            rows = self._rows[block] = list(zip(*([cell_text(v) for v in c] for c in cols)))
        return rows[row - block * BLOCK]

    # ------------------------------------------------------------- rendering

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._styles = {}
        self.refresh()

    def _line(self, texts: tuple[str | None, ...], style: Style, header: bool = False) -> Strip:
        right = (False,) * len(texts) if header else self._right  # headers read from the left
        text = "".join(" " + _fit(t, w, r) + " " for t, w, r in zip(texts, self._widths, right))
        return Strip([Segment(text, style)], cell_len(text))

    def render_lines(self, crop: Region) -> list[Strip]:
        # the widget's styles, looked up when they change (``rich_style`` and component
        # styles walk the DOM: a millisecond each)
        if not self.is_attached:
            # removed (a new result replaced it) but still asked to paint once: its
            # component styles are gone with it, so it paints nothing
            return [Strip.blank(crop.width)] * crop.height
        if not self._styles:
            self._styles = self._look_up_styles()
        return super().render_lines(crop)

    def _look_up_styles(self) -> dict[str, Style]:
        base = self.rich_style
        return {
            "": base,
            "header": base + self.get_component_rich_style("vtable--header"),
            "cursor": base + self.get_component_rich_style(
                "vtable--cursor" if self.has_focus else "vtable--cursor-blurred"),
            "hover": base + self.get_component_rich_style("vtable--hover"),
        }

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        styles = self._styles
        if y == 0:
            kind: str = "header"
            strip = self._strips.get(("header",))
            if strip is None:
                strip = self._strips[("header",)] = self._line(tuple(self._names), styles["header"], header=True)
        else:
            row = scroll_y + y - 1
            if row >= self.row_count:
                return Strip.blank(width, styles[""])
            kind = "cursor" if row == self.cursor_row else "hover" if row == self.hover_row else ""
            strip = self._strips.get((row, kind))
            if strip is None:
                if len(self._strips) > 4096:
                    self._strips.clear()
                strip = self._strips[(row, kind)] = self._line(self._cells(row), styles[kind])
        return strip.crop_extend(scroll_x, scroll_x + width, styles[kind])

    # ---------------------------------------------------------------- cursor

    @property
    def _page(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)  # rows below the header

    def move_cursor(self, row: int, *, scroll: bool = True) -> None:
        """Put the cursor on ``row`` (clamped) and bring it into view."""
        if not self.row_count:
            return
        row = max(0, min(row, self.row_count - 1))
        changed = row != self.cursor_row
        self.cursor_row = row
        if scroll:
            self._scroll_to_cursor()
        self.refresh()
        if changed:
            self.post_message(self.RowHighlighted(self, row))

    def _scroll_to_cursor(self) -> None:
        if not self.size.height:  # not laid out yet: once it is (on_resize)
            self._follow_cursor = True
            return
        top, page = round(self.scroll_y), self._page
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + page:
            self.scroll_to(y=self.cursor_row - page + 1, animate=False, immediate=True)

    def on_resize(self, _event: events.Resize) -> None:
        if self._follow_cursor:
            self._follow_cursor = False
            self.call_after_refresh(self._scroll_to_cursor)

    def on_focus(self) -> None:
        self._strips.clear()
        self._styles = {}
        self.refresh()

    def on_blur(self) -> None:
        self._strips.clear()
        self._styles = {}
        self.refresh()

    def action_move(self, step: int) -> None:
        self.move_cursor(self.cursor_row + step)

    def action_page(self, step: int) -> None:
        self.move_cursor(self.cursor_row + step * self._page)

    def action_first(self) -> None:
        self.move_cursor(0)

    def action_last(self) -> None:
        self.move_cursor(self.row_count - 1)

    def action_sideways(self, step: int) -> None:
        self.scroll_to(x=self.scroll_x + 4 * step, animate=False)

    def action_select(self) -> None:
        if self.row_count:
            self.post_message(self.RowSelected(self, self.cursor_row))

    # ----------------------------------------------------------------- mouse

    def _at(self, event: events.MouseEvent) -> tuple[int, int] | None:
        """(row, x in the table) under the mouse; row -1 is the header."""
        offset = event.get_content_offset(self)
        if offset is None:
            return None
        if offset.y == 0:
            return -1, offset.x + round(self.scroll_x)
        row = round(self.scroll_y) + offset.y - 1
        return (row, offset.x + round(self.scroll_x)) if row < self.row_count else None

    def on_click(self, event: events.Click) -> None:
        at = self._at(event)
        if at is None:
            return
        row, x = at
        if row < 0:
            edge = 0
            for i, w in enumerate(self._widths):
                edge += w + 2
                if x < edge:
                    self.post_message(self.HeaderSelected(self, i))
                    return
            return
        if row == self.cursor_row:
            self.action_select()
        else:
            self.move_cursor(row, scroll=False)

    def on_mouse_move(self, event: events.MouseMove) -> None:
        at = self._at(event)
        row = at[0] if at is not None and at[0] >= 0 else None
        if row != self.hover_row:
            self.hover_row = row
            self.refresh()

    def on_leave(self, _event: events.Leave) -> None:
        if self.hover_row is not None:
            self.hover_row = None
            self.refresh()

