"""The runs screen: every run under the opened folder with its status (live runs marked
and kept up to date), experiment, hash, sessions done/planned, outcome counts, mean
reward per role, start and duration. Enter opens a run; space marks two to compare."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import pyarrow as pa
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
from askspec.tui.components.table import ArrowTable
from askspec.tui.messages import Loaded, LoadFailed, OpenRun, StoreChanged

if TYPE_CHECKING:
    from askspec.tui.app import AskspecApp


def duration(start: dt.datetime | None, end: dt.datetime | None, live: bool) -> str:
    if start is None:
        return "-"
    if end is None:
        if not live:
            return "-"
        end = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    s = max(0, int((end - start).total_seconds()))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


def runs_table(runs: list[data.RunInfo], marked: set[str]) -> pa.Table:
    def status(r: data.RunInfo) -> str:
        mark = "✓ " if r.run_id in marked else ""
        glyph = "● " if r.live else ""
        return f"{mark}{glyph}{r.status or '?'}"

    def outcomes(r: data.RunInfo) -> str:
        if not r.summarized:
            return "…"
        parts = [f"{k} {v}" for k, v in sorted(r.outcomes.items(), key=lambda kv: -kv[1])]
        if r.errors:
            parts.append(f"error {r.errors}")
        if r.running:
            parts.append(f"running {r.running}")
        return ", ".join(parts) or "-"

    return pa.table({
        "status": [status(r) for r in runs],
        "run": [r.run_id for r in runs],
        # what changes first (the run id names the experiment; its hash is last)
        "sessions": [f"{r.done if r.summarized else '…'}/{r.planned if r.planned is not None else '?'}"
                     for r in runs],
        "outcomes": [outcomes(r) for r in runs],
        "mean reward": [", ".join(f"{k} {v:+.3f}" for k, v in r.mean_reward.items()) or ("-" if r.summarized else "…")
                        for r in runs],
        "started": [r.started_at.strftime("%Y-%m-%d %H:%M:%S") if r.started_at else "-" for r in runs],
        "duration": [duration(r.started_at, r.ended_at, r.live) for r in runs],
        "experiment": [r.experiment or "?" for r in runs],
        "hash": [(r.experiment_hash or "")[:12] for r in runs],
    })


def list_runs(source: data.Source) -> list[data.RunInfo]:
    """Worker side of listing the runs. Also converts a Python list to Arrow once: the
    first such conversion imports pandas (pyarrow checks for its types; ~0.8 s), which
    then happened on the UI thread when it built the runs table."""
    runs = data.list_runs(source)
    pa.array([""])
    return runs


class RunsScreen(Loader, Screen):
    app: AskspecApp  # the app this screen runs in (textual types it App[Any])

    BINDINGS = [
        Binding("enter", "open", "Open run", show=True, priority=False),
        Binding("space", "mark", "Mark for compare"),
        Binding("c", "compare", "Compare marked"),
        Binding("r", "reload", "Reload"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[data.RunInfo] = []
        self.marked: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="runs-title", classes="bar")
        yield ArrowTable(id="runs", empty="loading runs…")
        yield Static("", id="runs-status", classes="status")
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#runs-title", Static).update(
            Text(f"Runs in {printable(str(self.app.source.path), single_line=True)}"))

    def action_reload(self) -> None:
        # the manifests first (at once), then counts and rewards (a scan of every run)
        self.load("runs", list_runs, self.app.source)
        self.load("summaries", data.summarize_runs, self.app.source)

    def on_screen_resume(self) -> None:  # (also when first shown)
        self.app.source.resume("summaries")
        self.action_reload()

    def on_screen_suspend(self) -> None:
        # a run opened over this screen: its counts over every run can wait (on a large
        # run they would compete with the run's own first paint)
        self.app.source.pause("summaries")

    @on(StoreChanged)
    def _changed(self) -> None:
        self.action_reload()

    async def on_loaded(self, msg: Loaded) -> None:
        if msg.key not in ("runs", "summaries"):
            return
        msg.stop()
        runs: list[data.RunInfo] = msg.result
        if msg.key == "runs":  # keep the counts known until the new ones arrive
            before = {r.run_id: r for r in self.runs}
            runs = [before[r.run_id] if r.run_id in before and r.status == before[r.run_id].status else r
                    for r in runs]
        self.runs = self.app.known_runs = runs  # the palette offers them too
        table = self.query_one("#runs", ArrowTable)
        await table.update(runs_table(self.runs, set(self.marked)), key="run")
        table.focus_table()
        live = sum(r.live for r in self.runs)
        status = f"{len(self.runs)} run{'s' if len(self.runs) != 1 else ''}"
        if live:
            status += f", {live} running (● updates live)"
        if self.app.source.warnings:
            status += "  ⚠ " + "; ".join(self.app.source.warnings[:2])
        self.query_one("#runs-status", Static).update(Text(status))

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key == "summaries":
            msg.stop()
            if not msg.error.endswith("interrupted"):  # (by on_screen_suspend: redone on resume)
                self.query_one("#runs-status", Static).update(Text(f"⚠ {msg.error}"))
            return
        if msg.key != "runs":
            return
        msg.stop()
        self.runs = []
        text = msg.error
        if text.startswith("no runs in"):
            text += " — make one with: askspec run SPEC --out " + printable(str(self.app.source.path), single_line=True)
        self.query_one("#runs", ArrowTable).empty_text = text
        self.run_worker(self.query_one("#runs", ArrowTable).set_table(pa.table({}), empty=text))
        self.query_one("#runs-status", Static).update(Text(text))

    def _current(self) -> data.RunInfo | None:
        table = self.query_one("#runs", ArrowTable)
        if not table.row_count:
            return None
        run_id = table.row(table.cursor_row)["run"]
        return next((r for r in self.runs if r.run_id == run_id), None)

    @on(ArrowTable.Chosen, "#runs")
    def _chosen(self, event: ArrowTable.Chosen) -> None:
        self.post_message(OpenRun(event.row["run"]))

    def action_open(self) -> None:
        run = self._current()
        if run is not None:
            self.post_message(OpenRun(run.run_id))

    async def action_mark(self) -> None:
        run = self._current()
        if run is None:
            return
        if run.run_id in self.marked:
            self.marked.remove(run.run_id)
        else:
            self.marked = (self.marked + [run.run_id])[-2:]
        await self.query_one("#runs", ArrowTable).update(runs_table(self.runs, set(self.marked)), key="run")
        self.query_one("#runs-status", Static).update(Text(
            f"marked: {', '.join(self.marked) or 'none'}" + ("  — press c to compare" if len(self.marked) == 2 else "")))

    def action_compare(self) -> None:
        if len(self.marked) != 2:
            self.notify("mark two runs with space, then press c", severity="warning")
            return
        self.app.open_compare(*self.marked)
