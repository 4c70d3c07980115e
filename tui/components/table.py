"""``ArrowTable``: an Arrow table shown by textual-fastdatatable (Harlequin's table).

Only the visible rows are rendered, so a 100k-row table scrolls like a 10-row one. The
inner table is replaced (not mutated) when new data arrives, which is what
fastdatatable supports; the cursor row and focus carry over."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static
from textual_fastdatatable import ArrowBackend, DataTable


class ArrowTable(Vertical):
    DEFAULT_CSS = """
    ArrowTable { height: 1fr; }
    ArrowTable > DataTable { height: 1fr; }
    ArrowTable > .empty { color: $text-muted; padding: 0 1; }
    """

    class Chosen(Message):
        """Enter (or a click) on a row."""

        def __init__(self, table: "ArrowTable", index: int, row: dict[str, Any]) -> None:
            super().__init__()
            self.table = table
            self.index = index
            self.row = row

        @property
        def control(self) -> "ArrowTable":
            return self.table

    class Highlighted(Message):
        """The cursor moved to a row."""

        def __init__(self, table: "ArrowTable", index: int, row: dict[str, Any]) -> None:
            super().__init__()
            self.table = table
            self.index = index
            self.row = row

        @property
        def control(self) -> "ArrowTable":
            return self.table

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
        self._table: DataTable | None = None
        self.pending_row: int | None = None  # a cursor move waiting for the table's layout

    def compose(self) -> ComposeResult:
        yield Static(self.empty_text, classes="empty")

    @property
    def row_count(self) -> int:
        return 0 if self.data is None else self.data.num_rows

    @property
    def cursor_row(self) -> int:
        return self._table.cursor_row if self._table is not None else 0

    def row(self, index: int) -> dict[str, Any]:
        assert self.data is not None
        return self.data.slice(index, 1).to_pylist()[0]

    async def set_table(self, table: pa.Table, cursor_row: int | None = None, empty: str | None = None) -> None:
        """Show ``table``; the cursor goes to ``cursor_row`` (default: where it was)."""
        had_focus = self._table is not None and self._table.has_focus
        keep = self._table.cursor_row if self._table is not None else 0
        self.data = table
        if empty is not None:
            self.empty_text = empty
        await self.remove_children()
        self._table = None
        self.pending_row = None
        if table.num_rows == 0 or table.num_columns == 0:
            await self.mount(Static(self.empty_text, classes="empty"))
            return
        dt = DataTable(backend=ArrowBackend(table), cursor_type="row", show_row_labels=False,
                       render_markup=False, null_rep="-", max_column_content_width=self.max_width)
        self._table = dt
        await self.mount(dt)
        row = keep if cursor_row is None else cursor_row
        row = max(0, min(row, table.num_rows - 1))
        self.pending_row = row or None
        if row:
            dt.call_after_refresh(self._place_cursor, dt, row, 25)
        if had_focus:
            dt.focus()

    def _place_cursor(self, dt: DataTable, row: int, tries: int) -> None:
        """Move the cursor to ``row`` once the table has measured itself (it does so when
        idle); before that it cannot scroll to a row below the first screen."""
        if dt is not self._table:
            return  # replaced meanwhile
        if dt.virtual_size.height <= row + 1 and tries > 0:
            self.set_timer(0.02, lambda: self._place_cursor(dt, row, tries - 1))
            return
        dt.move_cursor(row=row, animate=False)
        self.pending_row = None

    @property
    def at_end(self) -> bool:
        """Whether the cursor is (or is about to be) on the last row."""
        if not self.row_count:
            return True
        row = self.pending_row if self.pending_row is not None else self.cursor_row
        return row >= self.row_count - 1

    def move_to(self, row: int) -> None:
        if self._table is not None and self.row_count:
            self._table.move_cursor(row=max(0, min(row, self.row_count - 1)), animate=False)

    def focus_table(self) -> None:
        if self._table is not None:
            self._table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if self.data is not None and 0 <= event.cursor_row < self.row_count:
            self.post_message(self.Chosen(self, event.cursor_row, self.row(event.cursor_row)))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if self.data is not None and 0 <= event.cursor_row < self.row_count:
            self.post_message(self.Highlighted(self, event.cursor_row, self.row(event.cursor_row)))

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        if self.data is not None and 0 <= event.column_index < self.data.num_columns:
            self.post_message(self.HeaderClicked(self, self.data.column_names[event.column_index]))
