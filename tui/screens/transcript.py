"""A session's transcript: its outcome, parameters and rewards, then every turn in order
(``TranscriptView``). A running session grows as its turns arrive."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Static

from askspec.terminal import printable
from askspec.tui import data
from askspec.tui.components.keybar import KeyBar
from askspec.tui.components.loader import Loader
from askspec.tui.components.transcript_view import TranscriptView
from askspec.tui.components.turn import TurnBlock
from askspec.tui.messages import Loaded, LoadFailed, StoreChanged
from askspec.tui.numbers import number
from askspec.tui.prefetch import TranscriptCache
from askspec.tui.shaping import Transcript

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp


def _short(v) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return number(v)
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
    params = p if isinstance(p := s.get("params"), dict) else {}
    for key in ("step", "stage"):  # set by the trainer
        if s.get(key) is not None:
            t.append(f"  {key} {_short(s[key])}")
    if s.get("error"):
        t.append(f"\nerror: {printable(s['error'], single_line=True)}", style="bold red")
    # (a run of store format < 4 kept its step and stage as ``__step__``..., said above, not listed)
    shown = {k: v for k, v in params.items() if not str(k).startswith("__")}
    if shown:
        t.append("\nparams: " + ", ".join(f"{printable(str(k), single_line=True)}={_short(v)}"
                                          for k, v in shown.items()))
    variables = v if isinstance(v := s.get("vars"), dict) else {}
    # (the bound data item is in both: said once, with the params)
    variables = {k: x for k, x in variables.items()
                 if not str(k).startswith("__") and (k not in params or params[k] != x)}
    if variables:
        t.append("\nvars: ", style="bold")
        t.append(", ".join(f"{printable(str(k), single_line=True)}={_short(v)}" for k, v in variables.items()))
    if tr.terminal_rewards:
        t.append("\nterminal rewards: ")
        for i, (r, n, v) in enumerate(tr.terminal_rewards):
            if i:
                t.append(", ")
            counted = tr.counts(r, n)
            t.append(f"{printable(r, single_line=True)} {printable(n, single_line=True)}={number(v, sign=True)}",
                     style="bold green" if counted else "dim strike")
            if not counted:
                t.append(" (replaced by the group's route)" if r in tr.routed else " (not used: no route)",
                         style="dim")
    totals = tr.totals
    if totals:
        t.append("   totals: " + ", ".join(f"{printable(r, single_line=True)} {number(v, sign=True)}" for r, v in totals.items()))
    return t


@dataclass
class Prepared:
    """A transcript as the screen shows it, built in a worker: the session's head line and
    each turn's block, wrapped to the width it was asked for."""

    transcript: Transcript
    head: Text
    blocks: list[TurnBlock]
    at: float  # when it was read (time.monotonic)


def prepare(source: data.Source, run_id: str, session_id: str, width: int) -> Prepared:
    at = time.monotonic()
    tr = data.transcript(source, run_id, session_id)
    return Prepared(tr, session_head(tr), [TurnBlock.of(t).prepare(width) for t in tr.turns], at)


def fetch(cache: TranscriptCache, fresh: bool, source: data.Source, run_id: str, session_id: str,
          width: int) -> Prepared:
    """Worker side of opening (or refreshing) a transcript, through the app's cache of
    transcripts fetched ahead (``askspec.tui.prefetch``)."""
    return cache.fetch((run_id, session_id), prepare, source, run_id, session_id, width, fresh=fresh)


# sessions whose transcript may still change (an errored one may be retried): one read
# more than FRESH seconds ago (ahead, while the cursor rested on it) is shown, then read again
UNSETTLED = (None, "running", "error")
FRESH = 1.0


class TranscriptScreen(Loader, Screen):
    """One screen for every transcript: the app installs it once and ``open`` swaps the
    session it shows (composing the screen and styling its widgets again for each
    transcript was most of the time to open one)."""

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
        self._reset()

    def _reset(self) -> None:
        self.transcript: Transcript | None = None
        self.shown = 0
        self._turn_cursor = -1
        self._prompts_open = False
        self._stick_to_end = False  # new turns keep the view at the end (see _scrolled)

    @property
    def _key(self) -> str:  # loads of another session (this screen showed before) are dropped
        return f"transcript {self.run_id} {self.session_id}"

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="session-head", classes="bar")
        yield TranscriptView(id="turns")
        yield KeyBar()

    def on_mount(self) -> None:
        self._progress = self.set_interval(0.25, self._indexing, pause=True)
        self.watch(self.query_one("#turns", TranscriptView), "scroll_y", self._scrolled, init=False)
        self._start()

    def open(self, run_id: str, session_id: str) -> None:
        """Show ``session_id`` (before the screen is pushed)."""
        self.run_id, self.session_id = run_id, session_id
        self._reset()
        if self.is_mounted:
            self._start()

    def _start(self) -> None:
        if not self.session_id:  # composed ahead, no session given yet
            return
        self.sub_title = f"{self.run_id} / {self.session_id}"
        view = self.query_one("#turns", TranscriptView)
        view.clear()
        cached = self.app.transcripts.get((self.run_id, self.session_id))
        if cached is not None:  # fetched while the cursor rested on its row
            self._show(cached)
            if cached.transcript.session.get("status") in UNSETTLED and time.monotonic() - cached.at > FRESH:
                self.reload()
        else:
            self.query_one("#session-head", Static).update(Text(f"loading {printable(self.session_id, single_line=True)}…"))
            self._progress.resume()
            self.load(self._key, fetch, self.app.transcripts, False, self.app.source, self.run_id,
                      self.session_id, view.wrap_width)

    def _scrolled(self, old: float, new: float) -> None:
        """Reaching the end keeps the view there as turns arrive; scrolling up stops it.
        (Checking the position alone when turns arrived lost the end on a loaded machine:
        the scroll to the end asked for with the last turns had not happened yet, so the
        view was not at the end and stayed where it was from then on.)"""
        if new < old:
            self._stick_to_end = False
        elif new >= self.query_one("#turns", TranscriptView).max_scroll_y - 1:
            self._stick_to_end = True

    def _indexing(self) -> None:
        """While the first transcript of a large run waits for its turns to be indexed."""
        done = self.app.source.indexing(self.run_id)
        if self.transcript is None and done is not None:
            self.query_one("#session-head", Static).update(Text(
                f"loading {printable(self.session_id, single_line=True)}… (indexing the run's turns by "
                f"session, once: {done:.0%})"))
        elif self.transcript is not None:
            self._progress.pause()

    def reload(self) -> None:
        self.load(self._key, fetch, self.app.transcripts, True, self.app.source, self.run_id, self.session_id,
                  self.query_one("#turns", TranscriptView).wrap_width)

    @on(StoreChanged)
    def _changed(self, event: StoreChanged) -> None:
        event.stop()
        if self.transcript is None or self.transcript.session.get("status") == "running":
            self.reload()

    def on_loaded(self, msg: Loaded) -> None:
        if not msg.key.startswith("transcript "):
            return
        msg.stop()
        if msg.key == self._key:
            self._show(msg.result)

    def _show(self, prepared: Prepared) -> None:
        tr = prepared.transcript
        self.transcript = tr
        self.query_one("#session-head", Static).update(prepared.head)
        view = self.query_one("#turns", TranscriptView)
        at_bottom = self._stick_to_end or view.scroll_y >= view.max_scroll_y - 1
        if not tr.turns and not self.shown:
            view.set_note("no turns recorded for this session" + (" yet" if tr.session.get("status") == "running"
                                                                    else ""))
        elif len(tr.turns) > self.shown:
            grows = self.shown > 0
            view.add(prepared.blocks[self.shown:])
            if self._prompts_open:
                view.toggle_prompts(True)
            if grows and at_bottom:  # a growing session: keep the newest turn in view
                view.scroll_end(animate=False)
        self.shown = len(tr.turns)

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key.startswith("transcript "):
            msg.stop()
            if msg.key == self._key:
                self.query_one("#session-head", Static).update(Text(f"⚠ {msg.error}", style="bold red"))

    def action_prompts(self) -> None:
        self._prompts_open = not self._prompts_open
        self.query_one("#turns", TranscriptView).toggle_prompts(self._prompts_open)

    def action_turn(self, step: int) -> None:
        view = self.query_one("#turns", TranscriptView)
        if not view.blocks:
            return
        self._turn_cursor = max(0, min(len(view.blocks) - 1, self._turn_cursor + step))
        view.scroll_to(y=view.turn_top(self._turn_cursor), animate=False)

    def action_end(self) -> None:
        self._stick_to_end = True
        self.query_one("#turns", TranscriptView).scroll_end(animate=False)
