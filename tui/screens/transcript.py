"""A session's transcript: its outcome, parameters and rewards, then every turn in order
(``TurnView``). A running session grows as its turns arrive."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, Static

from askspec.terminal import printable
from askspec.tui import data
from askspec.tui.components.keybar import KeyBar
from askspec.tui.components.loader import Loader
from askspec.tui.components.turn import PromptView, TurnView
from askspec.tui.messages import Loaded, LoadFailed, StoreChanged
from askspec.tui.shaping import Transcript

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp


def _short(v) -> str:
    s = json.dumps(v, ensure_ascii=False, default=str) if not isinstance(v, str) else v
    s = printable(s, single_line=True)
    return s if len(s) <= 80 else s[:79] + "…"


def session_head(tr: Transcript) -> Text:
    s = tr.session
    t = Text()
    t.append(f"{printable(s['session_id'], single_line=True)}", style="bold")
    t.append(f"  game {printable(s['game'] or '?', single_line=True)}")
    if s.get("group_id"):
        t.append(f"  group {printable(s['group_id'], single_line=True)}")
    status = s.get("status") or "?"
    t.append(f"  {status}", style="bold red" if status == "error" else "bold green" if status == "running" else "bold")
    if s.get("outcome"):
        t.append(f"  outcome {printable(s['outcome'], single_line=True)}", style="bold yellow")
    if (s.get("attempt") or 1) > 1:
        t.append(f"  attempt {s['attempt']}")
    t.append(f"  {len(tr.turns)} turns")
    if s.get("error"):
        t.append(f"\nerror: {printable(s['error'], single_line=True)}", style="bold red")
    params = s.get("params") if isinstance(s.get("params"), dict) else {}
    if params:
        t.append("\nparams: " + ", ".join(f"{printable(str(k), single_line=True)}={_short(v)}"
                                          for k, v in params.items()))
    if tr.terminal_rewards:
        t.append("\nterminal rewards: ")
        for i, (r, n, v) in enumerate(tr.terminal_rewards):
            if i:
                t.append(", ")
            counted = tr.counts(r, n)
            t.append(f"{printable(r, single_line=True)} {printable(n, single_line=True)}={v:+.4g}",
                     style="bold green" if counted else "dim strike")
            if not counted:
                t.append(" (replaced by the group's route)" if r in tr.routed else " (not used: no route)",
                         style="dim")
    totals = tr.totals
    if totals:
        t.append("   totals: " + ", ".join(f"{printable(r, single_line=True)} {v:+.4g}" for r, v in totals.items()))
    return t


FIRST_TURNS = 3  # turns mounted before the transcript's first paint


class TranscriptScreen(Loader, Screen):
    app: AskspecApp  # the app this runs in (textual types it App[Any])

    # focused from the start: a focus change once the turns arrive made the footer
    # rebuild its keys again, a good part of the time to open a transcript
    AUTO_FOCUS = "#turns"
    BINDINGS = [
        Binding("escape", "app.back", "Back"),
        Binding("p", "prompts", "Prompts"),
        Binding("n", "turn(1)", "Next turn"),
        Binding("N", "turn(-1)", "Previous turn"),
        Binding("G", "end", "Last turn"),
    ]

    def __init__(self, run_id: str, session_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.session_id = session_id
        self.transcript: Transcript | None = None
        self.shown = 0
        self._turn_cursor = -1
        self._prompts_open = False
        self._stick_to_end = False  # new turns keep the view at the end (see _scrolled)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"loading {printable(self.session_id, single_line=True)}…", id="session-head", classes="bar")
        yield VerticalScroll(id="turns")
        yield KeyBar()

    def on_mount(self) -> None:
        self.sub_title = f"{self.run_id} / {self.session_id}"
        self.reload()
        self._progress = self.set_interval(0.25, self._indexing)
        self.watch(self.query_one("#turns", VerticalScroll), "scroll_y", self._scrolled, init=False)

    def _scrolled(self, old: float, new: float) -> None:
        """Reaching the end keeps the view there as turns arrive; scrolling up stops it.
        (Checking the position alone when turns arrived lost the end on a loaded machine:
        the scroll to the end asked for with the last turns had not happened yet, so the
        view was not at the end and stayed where it was from then on.)"""
        if new < old:
            self._stick_to_end = False
        elif new >= self.query_one("#turns", VerticalScroll).max_scroll_y - 1:
            self._stick_to_end = True

    def _indexing(self) -> None:
        """While the first transcript of a large run waits for its turns to be indexed."""
        done = self.app.source.indexing(self.run_id)
        if self.transcript is None and done is not None:
            self.query_one("#session-head", Static).update(
                f"loading {printable(self.session_id, single_line=True)}… (indexing the run's turns by "
                f"session, once: {done:.0%})")
        elif self.transcript is not None:
            self._progress.stop()

    def reload(self) -> None:
        self.load("transcript", data.transcript, self.app.source, self.run_id, self.session_id)

    @on(StoreChanged)
    def _changed(self, event: StoreChanged) -> None:
        event.stop()
        if self.transcript is None or self.transcript.session.get("status") == "running":
            self.reload()

    async def on_loaded(self, msg: Loaded) -> None:
        if msg.key != "transcript":
            return
        msg.stop()
        tr: Transcript = msg.result
        self.transcript = tr
        self.query_one("#session-head", Static).update(session_head(tr))
        box = self.query_one("#turns", VerticalScroll)
        at_bottom = self._stick_to_end or box.scroll_y >= box.max_scroll_y - 1
        new = tr.turns[self.shown:]
        if not tr.turns and not self.shown:
            await box.mount(Static("no turns recorded for this session"
                                   + (" yet" if tr.session.get("status") == "running" else ""), id="no-turns"))
        elif new:
            for w in box.query("#no-turns"):
                await w.remove()
            if self.shown:
                await box.mount_all([TurnView(t) for t in new])
                if at_bottom:  # a growing session: keep the newest turn in view
                    box.scroll_end(animate=False)
            else:
                # the first turns fill the screen: paint them, then mount the rest
                # (laying out a long session's every turn first delayed the first paint)
                first = [TurnView(t) for t in new[:FIRST_TURNS]]
                await box.mount_all(first)
                if new[FIRST_TURNS:]:
                    self.call_after_refresh(self._mount_rest, [TurnView(t) for t in new[FIRST_TURNS:]], first[-1])
        self.shown = len(tr.turns)
        if self.focused is None:
            box.focus()

    async def _mount_rest(self, views: list[TurnView], after: TurnView) -> None:
        await self.query_one("#turns", VerticalScroll).mount_all(views, after=after)

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key == "transcript":
            msg.stop()
            self.query_one("#session-head", Static).update(Text(f"⚠ {msg.error}", style="bold red"))

    def action_prompts(self) -> None:
        self._prompts_open = not self._prompts_open
        for c in self.query(PromptView):
            c.set_collapsed(not self._prompts_open)

    def action_turn(self, step: int) -> None:
        views = list(self.query(TurnView))
        if not views:
            return
        self._turn_cursor = max(0, min(len(views) - 1, self._turn_cursor + step))
        self.query_one("#turns", VerticalScroll).scroll_to_widget(views[self._turn_cursor], top=True, animate=False)

    def action_end(self) -> None:
        self._stick_to_end = True
        self.query_one("#turns", VerticalScroll).scroll_end(animate=False)
