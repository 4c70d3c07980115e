"""The sessions tab: a run's sessions in a virtual table, filterable (see
``askspec.tui.filters``) and sortable, following a live run.

A large run paints its first sessions (from the head of its sessions file) while the
whole file is read, then all its sessions, and adds the reward columns when the run's
rewards have been read; then the turns are indexed (in a worker) so that transcripts
open at once. Updates go into the table in place: focus, scroll position and the row
under the cursor stay.

Follow mode: while the cursor is on the last row, new sessions are shown as they arrive
(the cursor stays on the newest). Moving the cursor up pauses following: the table stays
as it is and what arrives is counted in a badge until ``f`` (or moving back to the last
row) catches up."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.timer import Timer
from textual.widgets import Input, Static

from askspec.tui import columns, data
from askspec.tui.columns import ColumnChoice
from askspec.tui.components.loader import Loader
from askspec.tui.components.table import ArrowTable, in_shown_tab, prepare
from askspec.tui.components.transcript_view import text_width
from askspec.tui.components.vtable import TableLayout
from askspec.tui.filters import Filter, FilterError, parse_filter
from askspec.tui.messages import Loaded, LoadFailed, OpenSession, StoreChanged
from askspec.tui.screens import transcript
from askspec.tui.screens.columns import ColumnsScreen

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp
    from askspec.tui.screens.run import RunScreen

PREFETCH_REST = 0.15  # seconds on a row before its transcript is read ahead

TYPING_PAUSE_S = 1.0  # a pause this long after a filter was applied: letters are keys again
FILTER_HINT = ('filter: status:ok outcome:too_easy game:G group:G* role:R reward:0.5..1 step:3 stage:S '
               'var:NAME=V var:NAME>2 "text in a turn"  (Enter applies)')


@dataclass
class Rows:
    """One fetch of the sessions: the rows in plan order, as shown (sorted), and the
    shown rows' column layout, measured in the worker."""

    full: pa.Table
    shown: pa.Table
    layout: TableLayout
    rewards: bool


def fetch(source: data.Source, run_id: str, flt: Filter, rewards: bool, sort: str | None, desc: bool,
          choice: ColumnChoice | None = None) -> Rows:
    """Worker side of a sessions load: query, sort, hide the columns chosen hidden, measure."""
    choice = choice or ColumnChoice()
    rewards = rewards or data.rewards_are_cheap(source, run_id)
    full = data.sessions_table(source, run_id, flt, rewards=rewards, tokens=choice.tokens)
    shown = full
    if sort and sort in full.column_names:
        shown = full.sort_by([(sort, "descending" if desc else "ascending")])
    if choice.hidden:
        shown = shown.select([c for c in shown.column_names if c not in choice.hidden])
    return Rows(full, shown, prepare(shown), rewards)


def first_page(source: data.Source, run_id: str) -> Rows | None:
    """Worker side of the first paint of a large run (``data.first_sessions``)."""
    table = data.first_sessions(source, run_id)
    return None if table is None else Rows(table, table, prepare(table), False)


class SessionsPane(Loader, Vertical):
    app: AskspecApp  # the app this runs in (textual types it App[Any])
    screen: RunScreen  # the run screen holding this pane (textual types it Screen[object])

    BINDINGS = [
        Binding("slash", "focus_filter", "Filter"),
        Binding("c", "columns", "Columns"),
        Binding("s", "sort", "Sort by next column"),
        Binding("S", "reverse", "Reverse sort"),
        Binding("f", "follow", "Follow"),
    ]

    def __init__(self, run_id: str, live: bool) -> None:
        super().__init__(id="sessions-pane")
        self.run_id = run_id
        self.following = live
        self.pending: Rows | None = None  # arrived while following was paused
        self.filter_text = ""
        self.sort_col: str | None = None
        self.sort_desc = False
        self.full: pa.Table | None = None  # the rows shown, unsorted
        self._loaded_once = False
        self._rewards = False  # whether the reward columns were asked for yet
        self._shown_rewards = False  # whether the rows shown have them
        self._indexing = False
        self._force = True  # the user asked for this reload: show it even when paused
        self._rest: Timer | None = None  # the cursor resting on a row: then its transcript is read ahead
        self._refocus = False  # a filter was applied: the table takes focus when its rows come
        self._typing = False  # since the filter was applied only letters were typed: they go to the filter
        self._typed_at = 0.0  # when the last of those keys (or the Enter) was pressed
        self.choice = ColumnChoice()  # the columns shown (``askspec.tui.columns``), read on mount
        self.shown_columns: list[str] = []

    def compose(self) -> ComposeResult:
        yield Input(placeholder=FILTER_HINT, id="filter", select_on_focus=False)  # (typing goes on at the end)
        yield Static("loading sessions…", id="sessions-status", classes="status")
        yield ArrowTable(id="sessions", empty="loading sessions…")

    def on_mount(self) -> None:
        self.choice = columns.load(self.screen.run.experiment)
        # a large run: its first sessions, from the head of its file, paint first; then
        # the whole file is read (after: both at once slowed the first page down)
        self.load("first-page", first_page, self.app.source, self.run_id)

    def reload(self, user: bool = True) -> None:
        self._force = self._force or user
        try:
            flt = parse_filter(self.filter_text)
        except FilterError as e:
            self._status(f"⚠ {e}", error=True)
            return
        if flt.needs_turns:
            self._status("searching turns…")
        self.load("sessions", fetch, self.app.source, self.run_id, flt, self._rewards, self.sort_col,
                  self.sort_desc, self.choice)

    @on(StoreChanged)
    def _changed(self) -> None:
        self.reload(user=False)

    def _status(self, text: str, error: bool = False) -> None:
        w = self.query_one("#sessions-status", Static)
        w.update(Text(text))  # (not markup: it quotes the filter)
        w.set_class(error, "error")

    def _describe(self, shown: int) -> str:
        parts = [f"{shown} session{'s' if shown != 1 else ''}"]
        if self.filter_text.strip():
            parts.append(f"matching {self.filter_text.strip()!r}")
        if self.sort_col:
            parts.append(f"sorted by {self.sort_col} {'↓' if self.sort_desc else '↑'}")
        if self._loaded_once and not self._shown_rewards:
            parts.append("reading rewards…")
        if self.following and self.screen.live:
            parts.append("● following")
        elif self.pending is not None:
            n = self.pending.full.num_rows - (self.full.num_rows if self.full is not None else 0)
            parts.append(f"⏸ paused: +{max(n, 0)} new — press f to catch up")
        return "  ·  ".join(parts)

    async def on_loaded(self, msg: Loaded) -> None:
        if msg.key in ("turn-index", "prefetch"):  # (a prefetched transcript waits in the app's cache)
            msg.stop()
            return
        if msg.key == "first-page":
            msg.stop()
            page: Rows | None = msg.result
            if page is not None and not self._loaded_once and not self.filter_text.strip() and not self.sort_col:
                view = self.query_one("#sessions", ArrowTable)
                await view.update(page.shown, page.layout, key="session")
                if in_shown_tab(self):
                    view.focus_table()
                self._status(f"the first {page.shown.num_rows} sessions  ·  reading all sessions…")
            if not self._loaded_once:
                self.reload(user=False)
            return
        if msg.key != "sessions":
            return
        msg.stop()
        rows: Rows = msg.result
        first = not self._loaded_once
        self._loaded_once = True
        view = self.query_one("#sessions", ArrowTable)
        if self.screen.live and not first and not self._force:
            # a live update: follow only while the cursor is on the last row
            self.following = view.at_end
            if not self.following:
                if self.full is None or not rows.full.equals(self.full):
                    self.pending = rows  # shown when the user catches up
                self._status(self._describe(view.row_count))
                return
        await self._show(rows, to_end=self.following and self.screen.live, focus=first)
        if not self._rewards:
            self._rewards = True  # second step (unless they came along): the reward columns
            if not rows.rewards:
                self.reload(user=not self.screen.live)
                return
        if not self._indexing:
            self._indexing = True  # third step: index the turns so transcripts open at once
            self.load("turn-index", data.warm_run, self.app.source, self.run_id)
            self.app.transcript_screen()  # (and have their screen composed)

    async def _show(self, rows: Rows, to_end: bool, focus: bool = False) -> None:
        self.full, self.pending, self._force = rows.full, None, False
        self.shown_columns = rows.shown.column_names
        self._shown_rewards = rows.rewards
        view = self.query_one("#sessions", ArrowTable)
        flt = self.filter_text.strip()
        await view.update(rows.shown, rows.layout, key="session", to_end=to_end,
                          empty=f"no session matches {flt}" if flt else "no sessions yet")
        if (focus or self._refocus or self.screen.focused is None) and in_shown_tab(self):
            view.focus_table()  # (the rows, or the line saying none match: `/` edits the filter)
            if self._refocus and self._typing:  # (a pause starts once the rows are there to see)
                self._typed_at = time.monotonic()
        self._refocus = False
        self._status(self._describe(rows.shown.num_rows))

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key == "prefetch":  # said when the transcript is opened (and read again)
            msg.stop()
            return
        if msg.key == "first-page":
            msg.stop()
            if not self._loaded_once:
                self.reload(user=False)  # the whole table (says what is wrong, if anything)
            return
        if msg.key not in ("sessions", "turn-index"):
            return
        msg.stop()
        self._status(f"⚠ {msg.error}", error=True)

    @on(ArrowTable.Highlighted, "#sessions")
    async def _highlighted(self, event: ArrowTable.Highlighted) -> None:
        if self._rest is not None:
            self._rest.stop()
        self._rest = self.set_timer(PREFETCH_REST, partial(self._prefetch, event.row.get("session")))
        if not self.screen.live:
            return
        at_end = event.table.at_end
        if at_end and not self.following:
            self.following = True
            if self.pending is not None:  # back at the newest row: catch up
                await self._show(self.pending, to_end=True)
                return
        elif not at_end:
            self.following = False
        self._status(self._describe(event.table.row_count))

    def _prefetch(self, session_id: str | None) -> None:
        """Read the transcript of the session the cursor rests on ahead of Enter (once it
        has rested ``PREFETCH_REST``: scrolling through rows reads none; one fetch at a
        time; see ``askspec.tui.prefetch``)."""
        if (not self.app.prefetch or session_id is None
                or self.app.transcripts.get((self.run_id, session_id)) is not None):
            return
        self.load("prefetch", transcript.fetch, self.app.transcripts, False, self.app.source, self.run_id,
                  session_id, text_width(self.app.size.width))

    @on(ArrowTable.Chosen, "#sessions")
    def _chosen(self, event: ArrowTable.Chosen) -> None:
        self.post_message(OpenSession(self.run_id, event.row["session"]))

    @on(ArrowTable.HeaderClicked, "#sessions")
    def _header(self, event: ArrowTable.HeaderClicked) -> None:
        if self.sort_col == event.column:
            self.sort_desc = not self.sort_desc
        else:
            self.sort_col, self.sort_desc = event.column, False
        self.reload()

    @on(Input.Submitted, "#filter")
    def _filter(self, event: Input.Submitted) -> None:
        self.filter_text = event.value
        self._refocus = True
        self._typing, self._typed_at = True, time.monotonic()
        self.reload()
        self.query_one("#sessions", ArrowTable).focus_table()

    def on_key(self, event: events.Key) -> None:
        """Letters typed on right after a filter was applied (the table has taken the
        focus) go into the filter box, never to the table's keys (``S`` would reverse the
        sort). Any other key (an arrow, Enter, Escape) or a pause of ``TYPING_PAUSE_S``
        (after the last key, or after the filtered rows were shown, whichever came last)
        ends that: then letters are keys again (``t`` the theme, ``s`` the sort)."""
        if not self._typing:
            return
        box = self.query_one("#filter", Input)
        if self.screen.focused is box:
            if not event.is_printable:  # escape leaves the box (enter applies it again: typing goes on)
                self._typing = False
            else:
                self._typed_at = time.monotonic()
            return
        if time.monotonic() - self._typed_at > TYPING_PAUSE_S:
            self._typing = False
            return
        if event.is_printable and event.character is not None and event.key != "slash":
            event.stop()
            event.prevent_default()
            box.focus()
            box.cursor_position = len(box.value)
            box.insert_text_at_cursor(event.character)
            self._typed_at = time.monotonic()
        else:
            self._typing = False

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_sort(self) -> None:
        cols = self.shown_columns
        if not cols:
            return
        i = cols.index(self.sort_col) + 1 if self.sort_col in cols else 0
        self.sort_col = cols[i] if i < len(cols) else None
        self.sort_desc = False
        self.reload()

    def action_reverse(self) -> None:
        if self.sort_col is None and self.shown_columns:
            self.sort_col = self.shown_columns[0]
        self.sort_desc = not self.sort_desc
        self.reload()

    def action_columns(self) -> None:
        """The column chooser; the choice is remembered for the spec (``columns.save``)."""
        if self.full is None:
            return
        tokens = frozenset(data.token_column(r, d) for r in self.screen.run.roles for d in ("in", "out"))
        self.app.push_screen(ColumnsScreen(self.full.column_names, self.choice, self.screen.run.experiment, tokens),
                             self._chose_columns)

    def _chose_columns(self, choice: ColumnChoice | None) -> None:
        if choice is None or choice == self.choice:
            return
        self.choice = choice
        problem = columns.save(self.screen.run.experiment, choice)
        if problem:
            self.notify(problem, severity="warning", markup=False)
        if self.sort_col in choice.hidden:
            self.sort_col = None
        if choice.tokens:
            self._status("reading tokens…")  # (a scan of the run's turns)
        self.reload()

    async def action_follow(self) -> None:
        self.following = True
        if self.pending is not None:
            await self._show(self.pending, to_end=True)
        else:
            view = self.query_one("#sessions", ArrowTable)
            view.move_to(view.row_count - 1)
        self.reload()
