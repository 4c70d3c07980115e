"""``ArrowTable``: an Arrow table in a ``VirtualTable`` (only the visible rows are drawn),
or a line saying why there are no rows.

``set_table`` mounts a new inner table (a new result: the SQL console, a new filter);
``update`` gives the mounted one new rows in place (follow mode, reward columns
arriving): the widget stays, and with it focus, the scroll position and the cursor,
which stays on the same row by key (the session id) unless asked to go to the end.
Column widths are measured by ``prepare`` in the worker that fetched the rows, so a
100k-row update costs the UI thread no measuring."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static, TabbedContent, TabPane

from askspec.tui.components.guard import Guarded
from askspec.tui.components.vtable import TableLayout, VirtualTable, measure


def in_shown_tab(widget: Widget) -> bool:
    """Whether ``widget`` is on the tab shown (or on no tab): focusing a widget on another
    tab would switch to that tab."""
    pane = next((a for a in widget.ancestors if isinstance(a, TabPane)), None)
    tabs = next((a for a in widget.ancestors if isinstance(a, TabbedContent)), None)
    return pane is None or tabs is None or tabs.active == pane.id


class EmptyNote(Static, can_focus=True):
    """The line saying why there are no rows. It takes the focus where the table would
    have had it, so that the keys of the screen around it (and the app's) still answer."""


def prepare(table: pa.Table) -> TableLayout:
    """The table's column widths and alignments (call it in a worker thread)."""
    return measure(table)


class ArrowTable(Guarded, Vertical):
    DEFAULT_CSS = """
    ArrowTable { height: 1fr; }
    ArrowTable > VirtualTable { height: 1fr; }
    ArrowTable > .empty { color: $text-muted; padding: 0 1; }
    """

    class RowMessage(Message):
        """A message about one row: the table, the row's index and its values."""

        def __init__(self, table: "ArrowTable", index: int, row: dict[str, Any]) -> None:
            super().__init__()
            self.table = table
            self.index = index
            self.row = row

        @property
        def control(self) -> "ArrowTable":
            return self.table

    class Chosen(RowMessage):
        """Enter (or a click) on a row."""

    class Highlighted(RowMessage):
        """The cursor moved to a row."""

    class HeaderClicked(Message):
        def __init__(self, table: "ArrowTable", column: str) -> None:
            super().__init__()
            self.table = table
            self.column = column

        @property
        def control(self) -> "ArrowTable":
            return self.table

    def __init__(self, *, empty: str = "(no rows)", max_width: int = 60, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.data: pa.Table | None = None
        self.empty_text = empty
        self.max_width = max_width
        self._table: VirtualTable | None = None

    def compose(self) -> ComposeResult:
        yield EmptyNote(Text(self.empty_text), classes="empty")  # (text, not markup: it may quote data)

    @property
    def row_count(self) -> int:
        return 0 if self.data is None else self.data.num_rows

    @property
    def cursor_row(self) -> int:
        return self._table.cursor_row if self._table is not None else 0

    def row(self, index: int) -> dict[str, Any]:
        assert self.data is not None
        return self.data.slice(index, 1).to_pylist()[0]

    async def set_table(self, table: pa.Table, cursor_row: int | None = None, empty: str | None = None,
                        layout: TableLayout | None = None) -> None:
        """Show ``table`` in a new inner table; the cursor goes to ``cursor_row``
        (default: where it was)."""
        had_focus = self.has_focus_within
        keep = self._table.cursor_row if self._table is not None else 0
        self.data = table
        if empty is not None:
            self.empty_text = empty
        await self.remove_children()
        self._table = None
        if table.num_rows == 0 or table.num_columns == 0:
            note = EmptyNote(Text(self.empty_text), classes="empty")
            await self.mount(note)
            if had_focus:
                note.focus()
            return
        row = keep if cursor_row is None else cursor_row
        # (the cursor's row is scrolled into view once the table is laid out)
        vt = VirtualTable(table, layout or prepare(table), max_width=self.max_width,
                          cursor_row=max(0, min(row, table.num_rows - 1)))
        self._table = vt
        await self.mount(vt)
        if had_focus:
            vt.focus()

    async def update(self, table: pa.Table, layout: TableLayout | None = None, *, key: str | None = None,
                     to_end: bool = False, empty: str | None = None) -> None:
        """Show ``table`` in the inner table already mounted (``set_table`` if there is
        none, or the table is or becomes empty). The cursor stays on the row with the
        same ``key`` value (else the same index), or goes to the last row (``to_end``);
        the view does not move unless the cursor has to."""
        if empty is not None:
            self.empty_text = empty
        vt = self._table
        if vt is None or not table.num_rows or not table.num_columns:
            await self.set_table(table, cursor_row=table.num_rows - 1 if to_end else None, layout=layout)
            return
        old = self.data
        if old is not None and not to_end and table.equals(old):
            return  # nothing new (a follow-mode tick that changed other files)
        row = vt.cursor_row
        if to_end:
            row = table.num_rows - 1
        elif key and old is not None and key in old.column_names and key in table.column_names \
                and 0 <= row < old.num_rows:
            value = old.column(key)[row]
            hits = pc.indices_nonzero(pc.equal(table.column(key), value))
            if len(hits):
                row = hits[0].as_py()
        self.data = table
        vt.set_data(table, layout or prepare(table))
        if row != vt.cursor_row or to_end:
            vt.move_cursor(row)

    @property
    def at_end(self) -> bool:
        """Whether the cursor is on the last row."""
        return not self.row_count or self.cursor_row >= self.row_count - 1

    def move_to(self, row: int) -> None:
        if self._table is not None and self.row_count:
            self._table.move_cursor(row)

    def focus_table(self) -> None:
        """Focus the rows, or the line saying there are none."""
        target: Widget | None = self._table if self._table is not None else next(iter(self.query(EmptyNote)), None)
        if target is not None:
            target.focus()

    def on_virtual_table_row_selected(self, event: VirtualTable.RowSelected) -> None:
        event.stop()
        if self.data is not None and 0 <= event.row < self.row_count:
            self.post_message(self.Chosen(self, event.row, self.row(event.row)))

    def on_virtual_table_row_highlighted(self, event: VirtualTable.RowHighlighted) -> None:
        event.stop()
        if self.data is not None and 0 <= event.row < self.row_count:
            self.post_message(self.Highlighted(self, event.row, self.row(event.row)))

    def on_virtual_table_header_selected(self, event: VirtualTable.HeaderSelected) -> None:
        event.stop()
        if self.data is not None and 0 <= event.column < self.data.num_columns:
            self.post_message(self.HeaderClicked(self, self.data.column_names[event.column]))
