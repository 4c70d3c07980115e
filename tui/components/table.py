"""``ArrowTable``: an Arrow table shown by textual-fastdatatable (Harlequin's table).

Only the visible rows are rendered, so a 100k-row table scrolls like a 10-row one.
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
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static
from textual_fastdatatable import ArrowBackend, DataTable


def prepare(table: pa.Table) -> ArrowBackend:
    """A table backend with its column widths measured (call it in a worker thread)."""
    backend = ArrowBackend(table)
    backend.render_markup = False
    widths = backend.column_content_widths  # measured here, cached on the backend
    for i, col in enumerate(table.columns):
        # fastdatatable measures a float column by its largest and smallest value, so
        # 0.3238 between 0 and 1 was cut to "0.3…": measure each distinct value as it
        # shows it (format "n")
        if pa.types.is_floating(col.type) and col.null_count < len(col):
            shown = (len(f"{v:n}") for v in pc.unique(col).to_pylist() if v is not None)
            widths[i] = max(widths[i], *shown)
    return backend


class ArrowTable(Vertical):
    DEFAULT_CSS = """
    ArrowTable { height: 1fr; }
    ArrowTable > DataTable { height: 1fr; }
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

    async def set_table(self, table: pa.Table, cursor_row: int | None = None, empty: str | None = None,
                        backend: ArrowBackend | None = None) -> None:
        """Show ``table`` in a new inner table; the cursor goes to ``cursor_row``
        (default: where it was)."""
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
        dt = DataTable(backend=backend or prepare(table), cursor_type="row", show_row_labels=False,
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

    async def update(self, table: pa.Table, backend: ArrowBackend | None = None, *, key: str | None = None,
                     to_end: bool = False, empty: str | None = None) -> None:
        """Show ``table`` in the inner table already mounted (``set_table`` if there is
        none, or the table is or becomes empty). The cursor stays on the row with the
        same ``key`` value (else the same index), or goes to the last row (``to_end``);
        the view does not move unless the cursor has to."""
        if empty is not None:
            self.empty_text = empty
        dt = self._table
        if dt is None or not table.num_rows or not table.num_columns:
            await self.set_table(table, cursor_row=table.num_rows - 1 if to_end else None, backend=backend)
            return
        old = self.data
        if old is not None and not to_end and table.equals(old):
            return  # nothing new (a follow-mode tick that changed other files)
        row = self.pending_row if self.pending_row is not None else dt.cursor_row
        if to_end:
            row = table.num_rows - 1
        elif key and old is not None and key in old.column_names and key in table.column_names \
                and 0 <= row < old.num_rows:
            value = old.column(key)[row]
            hits = pc.indices_nonzero(pc.equal(table.column(key), value))
            if len(hits):
                row = hits[0].as_py()
        self.data = table
        self.pending_row = None  # (a placement still waiting gives up: see _place_cursor)
        backend = backend or prepare(table)
        # fastdatatable has no "replace the data" call: swap the backend and drop what
        # the table derived from the old one (column objects, render caches, size).
        dt.backend = backend
        dt._ordered_columns = None
        dt._clear_caches()
        dt._update_count += 1
        dt._update_dimensions([])
        dt.cursor_coordinate = dt.cursor_coordinate  # clamped to the new row count
        dt.refresh(layout=True)
        row = max(0, min(row, table.num_rows - 1))
        if not dt.size.height:  # not laid out yet: it cannot scroll to the row before that
            self.pending_row = row or None
            if row:
                dt.call_after_refresh(self._place_cursor, dt, row, 25)
        elif row != dt.cursor_row or to_end:
            dt.move_cursor(row=row, animate=False)

    def _place_cursor(self, dt: DataTable, row: int, tries: int) -> None:
        """Move the cursor to ``row`` once the table has measured itself (it does so when
        idle); before that it cannot scroll to a row below the first screen."""
        if dt is not self._table or self.pending_row != row:
            return  # replaced or updated meanwhile: that placed the cursor
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
