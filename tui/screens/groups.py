"""The groups tab: each group as the trainer saw it — its members' final rewards, their
mean and std, the advantage each member got, the route and why (the statistics the
route looked at, the arm that fired) — and its tournament matches (who met whom, which
was shown first, the verdict and the judge's reply) with the fitted strengths."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Static

from askspec.terminal import printable
from askspec.tui import data
from askspec.tui.components.loader import Loader
from askspec.tui.components.table import ArrowTable, in_shown_tab
from askspec.tui.messages import Loaded, LoadFailed, StoreChanged
from askspec.tui.shaping import GroupDetail

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp


def matches_table(detail: GroupDetail) -> pa.Table:
    ms = detail.matches
    return pa.table({
        "#": list(range(1, len(ms) + 1)),
        "a": [m["a"] for m in ms],
        "b": [m["b"] for m in ms],
        "shown first": [m["first_shown"] for m in ms],
        "verdict": [m["verdict"] for m in ms],
        "outcome": [m["outcome"] for m in ms],
        "judge's reply": [printable(m["raw"] or "", single_line=True) for m in ms],
    }, schema=pa.schema([("#", pa.int64()), ("a", pa.string()), ("b", pa.string()),
                         ("shown first", pa.string()), ("verdict", pa.string()), ("outcome", pa.float64()),
                         ("judge's reply", pa.string())]))


class GroupsPane(Loader, Horizontal):
    app: AskspecApp  # the app this runs in (textual types it App[Any])

    def __init__(self, run_id: str) -> None:
        super().__init__(id="groups-pane")
        self.run_id = run_id
        self.detail: GroupDetail | None = None
        self.group_id: str | None = None

    def compose(self) -> ComposeResult:
        yield ArrowTable(id="groups", empty="loading groups…", max_width=40)
        with VerticalScroll(id="group-detail"):
            yield Static("select a group", id="group-why")
            yield Static("matches", classes="section", id="matches-title")
            yield ArrowTable(id="matches", empty="no tournament matches in this group", max_width=50)
            yield Static("", id="judge-reply", classes="hidden")
            yield Static("members: rewards and the advantage each got", classes="section")
            yield ArrowTable(id="members", empty="-")

    def reload(self) -> None:
        self.load("groups", data.groups_table, self.app.source, self.run_id)

    @on(StoreChanged)
    def _changed(self) -> None:
        self.reload()

    async def on_loaded(self, msg: Loaded) -> None:
        if msg.key == "groups":
            msg.stop()
            table = self.query_one("#groups", ArrowTable)
            await table.update(msg.result, key="group",
                               empty="this run has no groups (no game samples groups or routes them)")
            self.query_one("#group-detail").display = bool(msg.result.num_rows)
            if self.screen.focused is None and in_shown_tab(self):  # (shown before its rows came: keys work at once)
                table.focus_table()
            if msg.result.num_rows and self.group_id is None:
                self.show_group(msg.result.column("group")[0].as_py())
            elif self.group_id is not None:
                self.show_group(self.group_id)  # its matches and rewards may have grown
        elif msg.key == "group":
            msg.stop()
            self.detail = d = msg.result
            why = Text()
            why.append(f"{printable(d.group_id, single_line=True)}", style="bold")
            why.append(f"  route: {printable(d.route, single_line=True)}\n", style="bold yellow")
            why.append("\n".join(printable(w, single_line=True) for w in d.why) or "(no statistics recorded)")
            self.query_one("#group-why", Static).update(why)
            await self.query_one("#matches", ArrowTable).update(matches_table(d), key="#")
            for part in ("#matches-title", "#matches"):  # (a group without a tournament has none)
                self.query_one(part).display = bool(d.matches)
            await self.query_one("#members", ArrowTable).update(d.members, key="session")
            reply = self.query_one("#judge-reply", Static)
            reply.set_class(not d.matches, "hidden")
            if d.matches:
                reply.update(self._reply_text(0))

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key in ("groups", "group"):
            msg.stop()
            self.query_one("#group-why", Static).update(Text(f"⚠ {msg.error}", style="bold red"))

    def show_group(self, group_id: str) -> None:
        self.group_id = group_id
        self.load("group", data.group_detail, self.app.source, self.run_id, group_id)

    @on(ArrowTable.Highlighted, "#groups")
    def _group(self, event: ArrowTable.Highlighted) -> None:
        if event.row["group"] != self.group_id:
            self.show_group(event.row["group"])

    @on(ArrowTable.Chosen, "#groups")
    def _group_chosen(self, event: ArrowTable.Chosen) -> None:
        self.show_group(event.row["group"])
        self.query_one("#matches", ArrowTable).focus_table()

    def _reply_text(self, index: int) -> Text:
        assert self.detail is not None
        m = self.detail.matches[index]
        t = Text(f"match {index + 1}: {m['a']} vs {m['b']}, shown first {m['first_shown']}, "
                 f"verdict {m['verdict']}\n", style="bold")
        t.append(printable(m["raw"] or "(no reply recorded)"))
        return t

    @on(ArrowTable.Highlighted, "#matches")
    def _match(self, event: ArrowTable.Highlighted) -> None:
        if self.detail is not None and event.index < len(self.detail.matches):
            self.query_one("#judge-reply", Static).update(self._reply_text(event.index))
