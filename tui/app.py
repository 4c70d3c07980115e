"""``askspec tui``: the Textual app (``AskspecApp(path)``).

Screens: runs -> a run (tabs: sessions, groups, metrics, SQL) -> a session's transcript;
compare two runs. All store access goes through ``askspec.tui.data`` in worker threads
(``components.loader``); the UI thread never waits on DuckDB. Follow mode: a timer
checks the runs' file sizes in a worker and tells the active screen when they grew.
"""

from __future__ import annotations

import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from askspec.runtime.store import layout
from askspec.tui import data
from askspec.tui.columns import state_dir
from askspec.tui.commands import RunsProvider
from askspec.tui.components.loader import Loader
from askspec.tui.components.transcript_view import text_width
from askspec.tui.messages import Loaded, LoadFailed, OpenRun, OpenSession, StoreChanged
from askspec.tui.prefetch import TranscriptCache
from askspec.tui.screens.compare import CompareScreen
from askspec.tui.screens.error import ErrorPanel, describe
from askspec.tui.screens.message import MessageScreen
from askspec.tui.screens.run import RunScreen
from askspec.tui.screens.runs import RunsScreen
from askspec.tui.screens import transcript
from askspec.tui.screens.transcript import TranscriptScreen

log = logging.getLogger("askspec.tui")

THEMES = ("textual-dark", "textual-light")
# this many unexpected errors within this many seconds (a screen failing on every frame,
# the error panel itself failing): the app cannot go on, and exits non-zero
ERROR_BURST = (8, 5.0)
OPEN_WAIT = 0.25  # seconds a transcript's read may take before its screen shows "loading…"


class AskspecApp(Loader, App):
    """Browse the runs under ``path`` (a folder of runs or one run directory)."""

    CSS_PATH = "app.tcss"
    TITLE = "askspec"
    COMMANDS = App.COMMANDS | {RunsProvider}
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("t", "toggle_theme", "Theme"),
        Binding("question_mark", "keys", "Keys"),
    ]

    def __init__(self, path: str | os.PathLike[str] = "runs", *, follow_interval: float = 1.0,
                 theme: str = "textual-dark", prefetch: bool = True) -> None:
        super().__init__()
        self.source = data.Source(path)
        self._sources = [self.source]  # closed on quit (``exit``)
        self.follow_interval = follow_interval
        self.initial_theme = theme
        self.sql_history: list[str] = []
        self.known_runs: list[data.RunInfo] = []
        self._fingerprint: tuple | None = None
        self.transcripts = TranscriptCache()  # fetched ahead while a session's row has the cursor
        self.prefetch = prefetch  # (off: each transcript is read when opened; the benchmark times both)
        self._transcript_screen: TranscriptScreen | None = None
        self._opening: tuple[str, str] | None = None  # (run, session) whose transcript is being read to open
        self._error_times: list[float] = []
        self.log_path: str | None = None  # where ``run`` sends the log (named in the error panel)

    def on_mount(self) -> None:
        self.theme = self.initial_theme
        problem = data.check_path(self.source.path)
        if problem:
            self.push_screen(MessageScreen(problem, "askspec tui [RUNS_DIR | RUN_DIR] opens a folder of runs "
                                                    "(default: runs/) or one run directory."))
            return
        self.push_screen(RunsScreen())
        if layout.is_run_dir(self.source.path):
            self.load("open-run", self._run_info, None)
        self.set_interval(self.follow_interval, self._poll)

    # ------------------------------------------------------------------ navigation

    def _run_info(self, run_id: str | None) -> data.RunInfo:
        if run_id is None:  # the one run of a run directory
            runs = data.list_runs(self.source)
            if not runs:
                raise data.DataError(f"no run under {self.source.path}")
            run_id = runs[0].run_id
        return data.run_info(self.source, run_id)

    @on(OpenRun)
    def _open_run(self, msg: OpenRun) -> None:
        known = next((r for r in self.known_runs if r.run_id == msg.run_id), None)
        if known is not None:  # open at once; the run's bar fills in its counts
            self.push_screen(RunScreen(known))
        else:
            self.load("open-run", self._run_info, msg.run_id)

    @on(OpenSession)
    def _open_session(self, msg: OpenSession) -> None:
        """Read the transcript first, then push its screen with the turns in place (one
        paint, not a "loading" screen and then the turns); a read slower than
        ``OPEN_WAIT`` (the run's turns still being indexed) shows the screen meanwhile."""
        key = (msg.run_id, msg.session_id)
        if self.transcripts.get(key) is not None:  # read ahead while the cursor rested on it
            self._push_transcript(key)
            return
        self._opening = key
        self.load("open-session", transcript.fetch, self.transcripts, False, self.source, *key,
                  text_width(self.size.width))
        self.set_timer(OPEN_WAIT, partial(self._opened, key))

    def _opened(self, key: tuple[str, str]) -> None:
        """The transcript of ``key`` was read (or is taking long): show it, unless the user
        opened another one or left the run meanwhile."""
        if self._opening != key:
            return
        self._opening = None
        if isinstance(self.screen, RunScreen) and self.screen.run.run_id == key[0]:
            self._push_transcript(key)

    def _push_transcript(self, key: tuple[str, str]) -> None:
        # one transcript screen, installed (so kept when popped) and given each session
        screen = self.transcript_screen()
        if screen in self.screen_stack:
            return
        screen.open(*key)
        self.push_screen(screen)

    def transcript_screen(self) -> TranscriptScreen:
        """The transcript screen, made and composed once, off screen. Called ahead by the
        sessions tab once its table is up, so the first transcript opened does not wait
        for the screen's widgets to be composed and styled."""
        if self._transcript_screen is None:
            screen = self._transcript_screen = TranscriptScreen("", "")
            self.install_screen(screen, name="transcript")
            # registered (composed, mounted, styled) without being shown: Textual does
            # this on the first push otherwise, which put it in the time to open
            self._get_screen(screen)
        return self._transcript_screen

    def open_compare(self, run_a: str, run_b: str) -> None:
        self.push_screen(CompareScreen(run_a, run_b))

    def open_source(self, path: str | os.PathLike[str]) -> data.Source:
        """A store of its own over ``path`` (the SQL console of one run of a folder),
        closed with the app's on quit."""
        source = data.Source(path)
        self._sources.append(source)
        return source

    def exit(self, result: Any = None, return_code: int = 0, message: Any = None) -> None:
        """Quit: first interrupt every query still running (a console query, the runs'
        counts), whose worker threads would otherwise keep the process alive until they
        ended (up to the console's 120 s)."""
        for source in self._sources:
            source.close()
        super().exit(result, return_code, message)

    async def action_back(self) -> None:  # async as textual's App.action_back it overrides
        if len(self.screen_stack) > 2:  # never pop the runs screen (or the default screen)
            self.pop_screen()

    # ------------------------------------------------------------------ follow mode

    def _poll(self) -> None:
        self.load("poll", data.fingerprint, self.source.path)

    def on_loaded(self, msg: Loaded) -> None:
        if msg.key == "poll":
            changed = self._fingerprint is not None and msg.result != self._fingerprint
            self._fingerprint = msg.result
            if changed and self.screen_stack:  # (none while the app shuts down)
                self.screen.post_message(StoreChanged())
        elif msg.key == "open-run" and self.screen_stack:
            self.push_screen(RunScreen(msg.result))
        elif (msg.key == "open-session" and self._opening is not None
              and self.transcripts.get(self._opening) is not None):  # (not an earlier Enter's)
            self._opened(self._opening)

    def on_load_failed(self, msg: LoadFailed) -> None:
        if msg.key == "open-run":
            self.notify(msg.error, severity="error", markup=False)
        elif msg.key == "open-session" and self._opening is not None:
            self._opened(self._opening)  # the transcript screen reads it again and says what is wrong

    # ------------------------------------------------------------------ errors

    def _handle_exception(self, error: Exception) -> None:
        """An exception that escaped a handler, a screen or a worker: logged with its
        traceback and shown in a panel, and the app goes on (Textual's own handling
        printed a traceback and exited). A burst of them (``ERROR_BURST``), or one
        before any screen is up, exits as Textual does, with return code 1."""
        now = time.monotonic()
        self._error_times = [t for t in self._error_times if now - t < ERROR_BURST[1]] + [now]
        log.error("unexpected error in the TUI", exc_info=error)
        if len(self._error_times) >= ERROR_BURST[0] or not self.is_running or not self.screen_stack:
            self._fatal(error)
            return
        try:
            self._show_error(error)
        except Exception:  # showing it failed too: exit, with the first error's traceback
            self._fatal(error)

    def _fatal(self, error: Exception) -> None:
        """Exit as Textual does on an error (its traceback printed, return code 1), its
        queries interrupted first (see ``exit``)."""
        for source in self._sources:
            source.close()
        super()._handle_exception(error)

    def _show_error(self, error: BaseException) -> None:
        text = describe(error)
        panel = next((s for s in self.screen_stack if isinstance(s, ErrorPanel)), None)
        if panel is not None:
            panel.show(text)
        else:
            self.push_screen(ErrorPanel(text, self.log_path))

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        """A worker that failed with ``exit_on_error=False`` (the ones that do not reach
        ``_handle_exception``): said the same way. (``Loader`` workers catch their
        errors and say them where they were asked for; none should arrive here.)"""
        worker = event.worker
        if event.state == WorkerState.ERROR and not worker.exit_on_error and worker.error is not None:
            if isinstance(worker.error, Exception):
                self._handle_exception(worker.error)

    # ------------------------------------------------------------------ looks, help

    def action_toggle_theme(self) -> None:
        self.theme = THEMES[1] if self.theme == THEMES[0] else THEMES[0]

    def action_keys(self) -> None:
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def get_system_commands(self, screen: Screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("Toggle light/dark", "Switch between the light and dark themes",
                            self.action_toggle_theme)
        if isinstance(screen, RunScreen):
            for key, title in (("sessions", "Sessions"), ("groups", "Groups and tournaments"),
                               ("metrics", "Metrics and plots"), ("sql", "SQL console")):
                yield SystemCommand(f"Go to {title}", f"the {title.lower()} tab of this run",
                                    lambda k=key: screen.action_tab(k))
        if isinstance(screen, RunsScreen):
            yield SystemCommand("Compare marked runs", "two runs side by side (mark with space)",
                                screen.action_compare)


def log_file() -> Path:
    """Where ``askspec tui`` logs (a terminal app cannot write to its own screen):
    ``$XDG_STATE_HOME/askspec/tui.log``, else ``~/.local/state/askspec/tui.log``."""
    return state_dir() / "tui.log"


def run(path: str | os.PathLike[str] = "runs") -> int:
    """Entry point of ``askspec tui`` (a bad path is explained on screen, not raised):
    0, or 1 when the app had to exit on an error."""
    app = AskspecApp(Path(path))
    handler: logging.Handler
    try:
        target = log_file()
        target.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(target, encoding="utf-8")
        app.log_path = str(target)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    except OSError:  # no writable state folder: errors are still shown, just not kept (and
        handler = logging.NullHandler()  # not printed over the screen by logging's last resort)
    log.addHandler(handler)
    try:
        app.run()
    finally:
        log.removeHandler(handler)
        handler.close()
    return app.return_code or 0
