"""The SQL tab: a console over the run's views (runs, sessions, turns, rewards, groups,
matches, train_steps) with a history (up/down), results in a table, errors inline.

The views are this run's alone (a store opened on its run directory), even when the app
shows a folder of runs: ``SELECT count(*) FROM sessions`` on a run's tab counts that
run's sessions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input, Static

from askspec.tui import data
from askspec.tui.components.loader import Loader
from askspec.tui.components.table import ArrowTable
from askspec.tui.messages import Loaded, LoadFailed

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp

SHOWN_ROWS = 100_000


class HistoryInput(Input):
    """An input line that recalls earlier entries with up/down."""

    BINDINGS = [
        Binding("up", "older", "Older query", show=False),
        Binding("down", "newer", "Newer query", show=False),
    ]

    def __init__(self, history: list[str], **kw) -> None:
        super().__init__(**kw)
        self.history = history
        self._pos: int | None = None

    def remember(self, text: str) -> None:
        if text.strip() and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._pos = None

    def action_older(self) -> None:
        if not self.history:
            return
        self._pos = len(self.history) - 1 if self._pos is None else max(0, self._pos - 1)
        self.value = self.history[self._pos]
        self.cursor_position = len(self.value)

    def action_newer(self) -> None:
        if self._pos is None:
            return
        self._pos += 1
        if self._pos >= len(self.history):
            self._pos = None
            self.value = ""
        else:
            self.value = self.history[self._pos]
        self.cursor_position = len(self.value)


class SqlPane(Loader, Vertical):
    app: AskspecApp  # the app this runs in (textual types it App[Any])

    def __init__(self, run_id: str, run_dir: str) -> None:
        super().__init__(id="sql-pane")
        self.run_id = run_id
        self.run_dir = run_dir
        self._source: data.Source | None = None

    @property
    def source(self) -> data.Source:
        """The app's store when it is this run alone, else one opened on the run's
        directory (cheap until the first query, which opens it in a worker)."""
        if self._source is None:
            app_source = self.app.source
            same = Path(app_source.path).resolve() == Path(self.run_dir).resolve()
            self._source = app_source if same else self.app.open_source(self.run_dir)
        return self._source

    def compose(self) -> ComposeResult:
        yield HistoryInput(self.app.sql_history, id="sql",
                           placeholder="SQL over runs, sessions, turns, rewards, groups, matches, train_steps "
                                       "(Enter runs it, ↑/↓ history)")
        yield Static("views over this run alone", id="sql-status", classes="status")
        yield ArrowTable(id="sql-result", empty="results appear here", max_width=60)

    @on(Input.Submitted, "#sql")
    def _run(self, event: Input.Submitted) -> None:
        event.stop()
        box = self.query_one("#sql", HistoryInput)
        box.remember(event.value)
        status = self.query_one("#sql-status", Static)
        status.update("running…")
        status.remove_class("error")
        self.load("sql", data.run_sql, self.source, event.value, SHOWN_ROWS)

    async def on_loaded(self, msg: Loaded) -> None:
        if msg.key != "sql":
            return
        msg.stop()
        table, total = msg.result
        await self.query_one("#sql-result", ArrowTable).set_table(table, cursor_row=0, empty="(no rows)")
        shown = f"{total} row{'s' if total != 1 else ''}"
        if total > table.num_rows:
            shown += f" (first {table.num_rows} shown)"
        self.query_one("#sql-status", Static).update(f"{shown} in {msg.seconds:.3f} s")

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key != "sql":
            return
        msg.stop()
        status = self.query_one("#sql-status", Static)
        status.update(Text(f"⚠ {msg.error}"))
        status.add_class("error")
