"""The sessions table's widget (``VirtualTable`` inside ``ArrowTable``) on a 100k-row
Arrow table, driven with Pilot: only the rows on screen are formatted, keys and the
mouse move the cursor and choose rows, a header click names its column; and the footer
(``KeyBar``) presses the key that is clicked."""

from __future__ import annotations

import pyarrow as pa
from textual.app import App, ComposeResult

from askspec.tui.components.keybar import KeyBar
from askspec.tui.components.table import ArrowTable
from askspec.tui.components.vtable import BLOCK, VirtualTable

from tui_helpers import screen_text, wait_until

ROWS = 100_000


def big_table() -> pa.Table:
    return pa.table({
        "#": pa.array(range(ROWS), pa.int64()),
        "session": [f"s{i:07d}" for i in range(ROWS)],
        "reward": [None if i % 7 == 0 else i / 8 for i in range(ROWS)],
        "note": ["x" * 100 if i == 1 else "ok" for i in range(ROWS)],
    })


class TableApp(App):
    BINDINGS = [("t", "toggle_dark", "Theme")]

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, object]] = []

    def compose(self) -> ComposeResult:
        yield ArrowTable(id="t", max_width=30)
        yield KeyBar()

    async def on_mount(self) -> None:
        table = self.query_one(ArrowTable)
        await table.set_table(big_table())
        table.focus_table()

    def on_arrow_table_highlighted(self, event: ArrowTable.Highlighted) -> None:
        self.events.append(("highlighted", event.row["session"]))

    def on_arrow_table_chosen(self, event: ArrowTable.Chosen) -> None:
        self.events.append(("chosen", event.row["session"]))

    def on_arrow_table_header_clicked(self, event: ArrowTable.HeaderClicked) -> None:
        self.events.append(("header", event.column))

    def action_toggle_dark(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"


def _vt(app) -> VirtualTable:
    return app.query_one(VirtualTable)


async def test_only_visible_rows_are_formatted_and_keys_move_the_cursor():
    app = TableApp()
    async with app.run_test(size=(100, 20)) as pilot:
        await wait_until(pilot, lambda: "s0000000" in screen_text(app), what="the first rows")
        vt = _vt(app)
        assert len(vt._rows) == 1  # the first block of rows, not 100k
        text = screen_text(app)
        assert "s0000017" in text and "s0000030" not in text
        # a null is a centred "-"; a value wider than the column is cut with "…"
        assert "x" * 29 + "…" in text and "x" * 30 not in text
        row0 = next(line for line in text.splitlines() if "s0000000" in line)
        assert " - " in row0
        await pilot.press("down", "down")
        assert vt.cursor_row == 2 and app.events[-1] == ("highlighted", "s0000002")
        await pilot.press("pagedown")
        assert vt.cursor_row == 2 + vt._page
        await pilot.press("end")
        await wait_until(pilot, lambda: "s0099999" in screen_text(app), what="the last row")
        assert vt.cursor_row == ROWS - 1 and "s0000000" not in screen_text(app)
        assert len(vt._rows) <= 3  # the first and the last blocks (and the one paged to)
        assert vt.scroll_y >= ROWS - vt._page
        await pilot.press("home", "enter")
        assert app.events[-1] == ("chosen", "s0000000")


async def test_mouse_moves_cursor_chooses_row_and_sorts_by_header():
    app = TableApp()
    async with app.run_test(size=(100, 20)) as pilot:
        await wait_until(pilot, lambda: "s0000000" in screen_text(app), what="the first rows")
        vt = _vt(app)
        # row 3 is on line 4 of the table (line 0 is the header)
        await pilot.click(VirtualTable, offset=(5, 4))
        assert vt.cursor_row == 3 and app.events[-1] == ("highlighted", "s0000003")
        await pilot.click(VirtualTable, offset=(5, 4))  # a click on the cursor's row chooses it
        assert app.events[-1] == ("chosen", "s0000003")
        await pilot.click(VirtualTable, offset=(12, 0))  # "session" (after " # " and its padding)
        assert app.events[-1] == ("header", "session")
        # scrolling (the wheel, the scrollbar) shows other rows without moving the cursor
        vt.scroll_to(y=5000, animate=False)
        await wait_until(pilot, lambda: "s0005000" in screen_text(app), what="the rows scrolled to")
        assert vt.cursor_row == 3 and "s0000003" not in screen_text(app)
        assert len(vt._rows) == 2


async def test_update_keeps_the_cursor_on_its_key():
    app = TableApp()
    async with app.run_test(size=(100, 20)) as pilot:
        await wait_until(pilot, lambda: "s0000000" in screen_text(app), what="the first rows")
        table = app.query_one(ArrowTable)
        table.move_to(500)
        await pilot.pause(0.05)
        inner = table._table
        # rows arrive before the one under the cursor: it stays on s0000500
        more = pa.concat_tables([big_table().slice(0, 10).set_column(
            1, "session", pa.array([f"new{i}" for i in range(10)])), big_table()])
        await table.update(more, key="session")
        await pilot.pause(0.05)
        assert table._table is inner and table.cursor_row == 510
        assert table.row(table.cursor_row)["session"] == "s0000500"
        assert "s0000500" in screen_text(app)


async def test_keybar_shows_keys_and_a_click_presses_one():
    app = TableApp()
    async with app.run_test(size=(100, 20)) as pilot:
        await wait_until(pilot, lambda: "Theme" in screen_text(app), what="the footer")
        bar = app.query_one(KeyBar)
        line = screen_text(app).splitlines()[-1]
        assert " t Theme " in line and "^p palette" in line
        x = next(start for start, _end, key in bar._spans if key == "t")
        theme = app.theme
        await pilot.click(KeyBar, offset=(x + 1, 0))
        assert app.theme != theme
