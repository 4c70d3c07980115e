"""One run: a bar with its identity and progress, and tabs for its sessions, groups,
metrics and a SQL console (keys 1-4). Live runs refresh as their files grow."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Input, Static, TabbedContent, TabPane

from askspec.terminal import printable
from askspec.tui import data
from askspec.tui.components.keybar import KeyBar
from askspec.tui.components.loader import Loader
from askspec.tui.components.table import ArrowTable
from askspec.tui.messages import Loaded, LoadFailed, StoreChanged
from askspec.tui.screens.groups import GroupsPane
from askspec.tui.screens.metrics import MetricsPane
from askspec.tui.screens.runs import duration
from askspec.tui.screens.sessions import SessionsPane
from askspec.tui.screens.sql import SqlPane

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp

TABS = ("sessions", "groups", "metrics", "sql")
# the tabs built when first shown that load on their own and follow the run (the SQL tab
# waits for a query)
PANES: dict[str, type[GroupsPane] | type[MetricsPane]] = {"groups": GroupsPane, "metrics": MetricsPane}


class RunScreen(Loader, Screen):
    app: AskspecApp  # the app this runs in (textual types it App[Any])

    AUTO_FOCUS = None  # the sessions table takes focus once loaded, not the filter box
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("1", "tab('sessions')", "Sessions"),
        Binding("2", "tab('groups')", "Groups"),
        Binding("3", "tab('metrics')", "Metrics"),
        Binding("4", "tab('sql')", "SQL"),
    ]

    def __init__(self, run: data.RunInfo) -> None:
        super().__init__()
        self.run = run
        self.live = run.live
        self._loaded_tabs: set[str] = set()  # tabs other than sessions are built when first shown

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(self._bar(), id="run-bar", classes="bar")
        with TabbedContent(initial="tab-sessions", id="tabs"):
            with TabPane("Sessions [1]", id="tab-sessions"):
                yield SessionsPane(self.run.run_id, self.live)
            # the other tabs are built when first shown: less to mount before the
            # sessions table can paint
            yield TabPane("Groups [2]", id="tab-groups")
            yield TabPane("Metrics [3]", id="tab-metrics")
            yield TabPane("SQL [4]", id="tab-sql")
        yield KeyBar()

    def _bar(self) -> Text:
        r = self.run
        t = Text()
        t.append(printable(r.run_id, single_line=True), style="bold")
        t.append(f"  {printable(r.experiment or '?', single_line=True)} {(r.experiment_hash or '')[:12]}")
        t.append("  ● running" if r.live else f"  {r.status}", style="bold green" if r.live else "")
        t.append(f"  sessions {r.done if r.summarized else '…'}/{r.planned if r.planned is not None else '?'}")
        if r.running:
            t.append(f" ({r.running} in flight)")
        if r.errors:
            t.append(f"  errors {r.errors}", style="bold red")
        t.append(f"  {duration(r.started_at, r.ended_at, r.live)}")
        return t

    async def action_back(self) -> None:
        """Escape leaves a text box first (back to its table), then the run."""
        if isinstance(self.focused, Input):
            pane = self.query_one("#tabs", TabbedContent).active.removeprefix("tab-")
            target = {"sessions": "#sessions", "sql": "#sql-result"}.get(pane)
            if target:
                self.query_one(target, ArrowTable).focus_table()
                if self.focused is not None and not isinstance(self.focused, Input):
                    return
            self.set_focus(None)
            return
        await self.app.action_back()

    def action_tab(self, tab: str) -> None:
        self.query_one("#tabs", TabbedContent).active = f"tab-{tab}"

    @on(TabbedContent.TabActivated)
    async def _tab(self, event: TabbedContent.TabActivated) -> None:
        pane = (event.pane.id or "").removeprefix("tab-")
        if pane == "sql" and pane not in self._loaded_tabs:
            self._loaded_tabs.add(pane)
            await event.pane.mount(SqlPane(self.run.run_id, self.run.run_dir))
        elif pane in PANES and pane not in self._loaded_tabs:
            self._loaded_tabs.add(pane)
            widget = PANES[pane](self.run.run_id)
            await event.pane.mount(widget)
            widget.reload()
        if pane == "sql":
            self.query_one("#sql").focus()
        elif pane == "sessions":
            self.query_one("#sessions", ArrowTable).focus_table()
        elif pane == "groups":
            self.query_one("#groups", ArrowTable).focus_table()
        elif pane == "metrics":  # (the page scrolls: PageDown works at once)
            self.query_one("#metrics-pane").focus()

    @on(StoreChanged)
    def _changed(self, event: StoreChanged) -> None:
        event.stop()
        self.load("run", data.run_info, self.app.source, self.run.run_id)
        self.query_one(SessionsPane).post_message(StoreChanged())
        for pane in ("groups", "metrics"):
            if pane in self._loaded_tabs:
                self.query_one(f"#{pane}-pane").post_message(StoreChanged())

    def on_mount(self) -> None:
        if not self.run.summarized:
            self.load("run", data.run_info, self.app.source, self.run.run_id)

    def on_loaded(self, msg: Loaded) -> None:
        if msg.key == "run":
            msg.stop()
            if msg.result is not None:
                self.run = msg.result
                self.live = self.run.live
                self.query_one("#run-bar", Static).update(self._bar())

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key == "run":
            msg.stop()
            self.notify(msg.error, severity="error", markup=False)
