"""The app keeps going and shows data as data: a filter that matches nothing says so in
place (every documented filter form), ids, paths and filter text holding Rich markup
are shown as written, an exception escaping a worker or a handler is shown in a panel
and logged while the app runs on, and quitting while a console query runs exits at once."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest
from textual.app import App, ComposeResult

import pyarrow as pa

from askspec.runtime.store.writer import RunWriter
from askspec.tui import app as tui_app
from askspec.tui.app import AskspecApp
from askspec.tui.components.vtable import VirtualTable
from askspec.tui.screens.error import ErrorPanel
from askspec.tui.screens import sessions
from askspec.tui.screens.run import RunScreen
from askspec.tui.screens.transcript import TranscriptScreen

from tui_helpers import ROOT, build_demo_run, freeze, screen_text, shows, type_text, wait_until

SIZE = (150, 40)

# the filter forms of docs/tui.md's table and the filter box's hint, each with values no
# session of ``_plain_run`` has
EMPTY_FILTERS = [
    "status:cancelled",
    "status:cancelled,interrupted",
    "outcome:too_easy",  # the hint's own example, on a run without that outcome
    "outcome:-",
    "game:calibrate",
    "group:g1*",
    "group:-",
    "role:questioner",
    "reward:0.5..1",
    "reward:..-1",
    "reward:3",
    '"what is 2+2"',
    "words",
    "status:ok outcome:too_easy game:G group:G* role:R reward:0.5..1 \"text in a turn\"",
]


def _plain_run(out, run_id="20260102-030405-plain-run001", session_ids=("s000000", "s000001", "s000002")):
    """A finished run of three ok sessions (outcome ``solved``, game ``play``, group
    ``h0``, one ``player`` turn each, reward 0.1)."""
    w = RunWriter.create(out, experiment="plain", experiment_hash="0" * 64, ir_json="{}", spec_files={}, seed=0,
                         roles={"player": {"model": "m"}}, params={}, planned_sessions=len(session_ids),
                         argv=["askspec"], flush_interval=0)
    for i, sid in enumerate(session_ids):
        att = w.session_started(sid, game="play", group_id="h0", params={}, index=i)
        w.turn(sid, att, turn_index=0, role="player", model="m", prompt=[{"role": "user", "content": "go"}],
               text=f"reply number {i}", parsed={}, finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=1.0)
        w.reward(sid, att, role="player", turn_index=None, name="r", value=0.1, kind="terminal")
        w.session_finished(sid, att, status="ok", outcome="solved", error=None, vars={})
    w.finish("finished")
    return freeze(w.run_dir, run_id)


async def _filter(pilot, app, text: str, typed: bool = False) -> None:
    """Open the filter box with `/` and submit ``text`` with Enter; ``typed`` types it key
    by key as a person would (type_text), otherwise it is pasted in."""
    box = app.screen.query_one("#filter")
    box.value = ""
    if not box.has_focus:  # (after an empty result it keeps the focus: no table to go back to)
        await pilot.press("slash")
    if typed:
        await type_text(pilot, text)
    else:
        box.value = text
    await pilot.press("enter")


async def test_every_filter_form_that_matches_nothing_says_so_in_place(tmp_path):
    run_dir = _plain_run(tmp_path / "runs")
    app = AskspecApp(run_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and "3 sessions" in screen_text(app))
        for text in EMPTY_FILTERS:
            await _filter(pilot, app, text, typed=text == "outcome:too_easy")
            await wait_until(pilot, shows(app, f"no session matches {text}", "0 sessions"), what=text)
            assert app.is_running and isinstance(app.screen, RunScreen)
            await _filter(pilot, app, "")  # the rows back: the next empty result replaces a drawn table
            await wait_until(pilot, shows(app, "3 sessions", "s000002"), what=f"all rows after {text}")
        assert app._exception is None


async def test_a_removed_table_asked_to_paint_paints_nothing():
    # what crashed the app with KeyError 'vtable--header' (a filter matching nothing
    # removes the table; the compositor may still paint it once, its styles gone)
    from textual.geometry import Region

    class One(App):
        def compose(self) -> ComposeResult:
            yield VirtualTable(pa.table({"a": [1, 2]}))

    app = One()
    async with app.run_test(size=(40, 8)) as pilot:
        widget = app.screen.children[0]
        widget.focus()
        await pilot.pause()
        await widget.remove()  # (its blur forgets the styles it looked up)
        strips = widget.render_lines(Region(0, 0, 20, 3))
        assert len(strips) == 3 and all(not s.text.strip() for s in strips)


MARKUP_SESSIONS = ("s[/]1", "s[bold]2", "s[link=x]3")


async def test_ids_paths_and_filters_holding_markup_show_as_written(tmp_path):
    folder = tmp_path / "runs[/b]"
    run_a = _plain_run(folder, "20260102-030405-plain-[bold]a", MARKUP_SESSIONS)
    _plain_run(folder, "20260102-030406-plain-[i]b")
    app = AskspecApp(folder)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "runs[/b]", "plain-[bold]a", "plain-[i]b"), what="the runs")
        # the palette lists the runs by id
        await pilot.press("ctrl+p")
        await type_text(pilot, "open run")
        await wait_until(pilot, shows(app, "open run 20260102-030405-plain-[bold]a"), what="the palette")
        await pilot.press("escape")
        await pilot.press("space", "down", "space")  # marked, then compared (their ids in the head line)
        await wait_until(pilot, shows(app, "marked: 20260102-030405-plain-[bold]a, 20260102-030406-plain-[i]b"))
        await pilot.press("c")
        await wait_until(pilot, shows(app, "A: 20260102-030405-plain-[bold]a", "B: 20260102-030406-plain-[i]b",
                                      "rate solved"), what="the comparison")
        await pilot.press("escape")
        app.post_message(tui_app.OpenRun(run_a.name))
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and "3 sessions" in screen_text(app))
        assert all(s in screen_text(app) for s in MARKUP_SESSIONS)
        await _filter(pilot, app, "group:[/] game:runs[bold]x")
        await wait_until(pilot, shows(app, "no session matches group:[/] game:runs[bold]x",
                                      "matching 'group:[/] game:runs[bold]x'"))
        await _filter(pilot, app, "")
        await wait_until(pilot, shows(app, "3 sessions"))
        await pilot.press("enter")  # the first session, s[/]1 (the table took the focus back with its rows)
        await wait_until(pilot, lambda: isinstance(app.screen, TranscriptScreen) and "s[/]1" in screen_text(app),
                         what="the transcript of s[/]1")
        assert app._exception is None


async def test_keys_answer_again_once_typing_after_a_filter_pauses(tmp_path, monkeypatch):
    # (#33: after the session filter `[/]` the theme key `t` went on into the filter box;
    # letters typed on at once still do, see test_tui_research)
    monkeypatch.setattr(sessions, "TYPING_PAUSE_S", 0.4)  # (the rule, with a shorter pause than a person's)
    app = AskspecApp(_plain_run(tmp_path / "runs"), follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and "3 sessions" in screen_text(app))
        box = app.screen.query_one("#filter")
        for text, shown in (("[/]", "no session matches [/]"), ("status:ok", "s000002"),
                            ("[bold]x", "no session matches [bold]x")):
            await _filter(pilot, app, text, typed=True)
            await wait_until(pilot, shows(app, f"matching {text!r}", shown), what=text)
            await pilot.pause(sessions.TYPING_PAUSE_S + 0.3)
            theme = app.theme
            await pilot.press("t")
            await wait_until(pilot, lambda: app.theme != theme, what=f"t answered after the filter {text}")
            assert box.value == text and not box.has_focus
            await pilot.press("slash")  # (and `/` is the way back into the box, rows or none)
            await wait_until(pilot, lambda: box.has_focus, what=f"/ after the filter {text}")
        assert app._exception is None


async def test_a_failing_worker_is_shown_in_a_panel_and_logged_and_the_app_goes_on(tmp_path, caplog):
    run_dir = _plain_run(tmp_path / "runs")
    app = AskspecApp(run_dir)

    def fails() -> None:
        raise RuntimeError("injected [bold]failure[/] in a worker")

    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and "3 sessions" in screen_text(app))
        with caplog.at_level(logging.ERROR, logger="askspec.tui"):
            app.run_worker(fails, thread=True)  # (exit_on_error: Textual would exit with a traceback)
            await wait_until(pilot, shows(app, "unexpected error", "RuntimeError: injected [bold]failure[/] in a worker"))
        assert isinstance(app.screen, ErrorPanel) and app.is_running
        assert any(r.exc_info and "injected" in str(r.exc_info[1]) for r in caplog.records)
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen))
        # a worker that does not exit on errors, and a failing handler: said the same way
        app.run_worker(fails, thread=True, exit_on_error=False)
        await wait_until(pilot, shows(app, "RuntimeError: injected"))
        await pilot.press("escape")

        def handler_fails() -> None:
            raise ValueError("a handler broke")

        app.call_later(handler_fails)
        await wait_until(pilot, shows(app, "ValueError: a handler broke"))
        await pilot.press("escape")
        await _filter(pilot, app, "outcome:solved")  # and the app still works
        await wait_until(pilot, shows(app, "3 sessions", "matching 'outcome:solved'"))
    assert not app.return_code and app._exception is None  # (run_test leaves it None; 1 after a fatal error)


async def test_errors_that_keep_coming_exit_non_zero(tmp_path):
    app = AskspecApp(_plain_run(tmp_path / "runs"))

    def handler_fails() -> None:
        raise ValueError("again")

    with pytest.raises(ValueError, match="again"):  # (Pilot re-raises the error the app exited on)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen))
            for _ in range(tui_app.ERROR_BURST[0]):
                app.call_later(handler_fails)
            await pilot.pause(0.5)
    assert app.return_code == 1


def test_the_command_exits_with_the_apps_return_code(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def fail_run(self) -> None:
        self._return_code = 1

    monkeypatch.setattr(AskspecApp, "run", fail_run)
    assert tui_app.run(tmp_path) == 1
    assert (tmp_path / "state" / "askspec" / "tui.log").exists()


QUIT_SCRIPT = r"""
import asyncio, sys, time
sys.path.insert(0, sys.argv[2])
from tui_helpers import screen_text, shows, wait_until
from askspec.tui.app import AskspecApp
from askspec.tui.screens.run import RunScreen

async def main():
    app = AskspecApp(sys.argv[1])
    async with app.run_test(size=(140, 40)) as pilot:
        # the table loaded and focused ("session" alone matched the tab's label before it
        # was: under load the 4 then went into the filter box, not to the SQL tab)
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and "3 sessions" in screen_text(app)
                         and app.focused is not None and app.focused.id != "filter")
        await pilot.press("4")
        await wait_until(pilot, shows(app, "views over this run alone"))
        app.focused.value = "SELECT sum(range) FROM range(10000000000000)"  # (pasted: typing costs ~3 s)
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "running…"))
        await pilot.press("escape")  # out of the query box
        await pilot.pause(0.5)  # the query is under way in its worker thread
        print("QUIT", time.time(), flush=True)
        await pilot.press("q")
    print("APP-DONE", time.time(), flush=True)

asyncio.run(main())
"""


def test_quitting_while_a_console_query_runs_exits_at_once(tmp_path):
    run_dir = _plain_run(tmp_path / "runs")
    proc = subprocess.run([sys.executable, "-c", QUIT_SCRIPT, str(run_dir), str(ROOT / "tests" / "tui")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    ended = time.time()
    assert proc.returncode == 0, proc.stderr[-3000:]
    at = {line.split()[0]: float(line.split()[1]) for line in proc.stdout.splitlines() if line[:1].isupper()}
    # before: the app's loop ended at once but the worker thread ran the query to the
    # console's 120 s limit, and the process waited for it
    assert at["APP-DONE"] - at["QUIT"] < 1.0, f"{at['APP-DONE'] - at['QUIT']:.2f} s from q to the app's end"
    # (then the interpreter's own exit: about a second on a loaded machine)
    assert ended - at["QUIT"] < 5.0, f"{ended - at['QUIT']:.2f} s from q to the process's end"


# every kind of value a trainer might record in a plotted column: plotext turned spans past
# the largest float into OverflowError (ValueError for nan) on every render
EXTREMES = [1e308, -1e308, 1.7976931348623157e308, float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 5e-324,
            -5e-324]


@pytest.mark.parametrize("value", EXTREMES, ids=repr)
def test_a_plot_draws_any_value_a_column_holds(value):
    """Each value beside ordinary ones and beside its opposite: drawn (a finite one past
    ±PLOT_LIMIT at the limit, a non-finite one left out), and the title says so."""
    import math

    import plotext

    from askspec.tui.screens.metrics import PLOT_LIMIT, plottable

    for points in ([(1, 0.5), (2, value), (3, 1.0)], [(1, value), (2, -value)], [(1, value)]):
        lines, said = plottable([("grad_norm", points)])
        plotext.clear_figure()
        plotext.plotsize(60, 12)
        ys = [y for _, y in lines[0][1]]
        if len(ys) > 1:
            plotext.plot([x for x, _ in lines[0][1]], ys)
        elif ys:
            plotext.scatter([x for x, _ in lines[0][1]], ys)
        plotext.build()  # raises what a render would
        assert all(math.isfinite(y) and abs(y) <= PLOT_LIMIT for y in ys)
        if not math.isfinite(value):
            assert "non-finite value" in said
        elif abs(value) > PLOT_LIMIT:
            assert "drawn at it" in said
        else:
            assert said == "" and ys == [y for _, y in points]


async def test_the_metrics_tab_survives_extreme_training_values(tmp_path):
    """grad_norm = 1e308 made every repaint raise OverflowError: the app answered no key.
    Each extreme in the plotted columns (a reward band of 1e308 ± 1e308 overflows too):
    the curves are drawn, what was clamped is said on screen, keys work."""
    import math

    from askspec.tui.screens.metrics import TrainPlot

    from tui_helpers import _writer

    w = _writer(tmp_path / "runs", "extreme_run", planned_sessions=1)
    a = w.session_started("s0", game="g", group_id=None, params={}, index=0)
    w.session_finished("s0", a, status="ok", outcome="done", error=None, vars={})
    for step, v in enumerate(EXTREMES, 1):
        w.train_step("solver", step, {"grad_norm": v, "loss": -v if math.isfinite(v) else 0.5, "kl": 1e308,
                                      "reward_mean": v if math.isfinite(v) else 1e308, "reward_std": 1e308})
    w.finish()
    app = AskspecApp(tmp_path / "runs", follow_interval=3600)
    async with app.run_test(size=(150, 60)) as pilot:
        await wait_until(pilot, shows(app, "extreme_run"), what="the run")
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        await pilot.press("3")
        await wait_until(pilot, lambda: len(app.screen.query(TrainPlot)) >= 3, what="the training curves")
        # (the run store records a non-finite value as null: no point, nothing to say)
        await wait_until(pilot, shows(app, "solver: grad norm: 3 values past", "6 non-finite", "solver: kl (clamped)"),
                         what="the curves and what was clamped")
        assert "cannot draw this plot" not in screen_text(app)
        assert any("\u2800" < ch <= "\u28ff" for ch in screen_text(app))  # braille: a curve drawn
        theme = app.theme
        await pilot.press("t")  # a key is answered while the plots are on screen
        await wait_until(pilot, lambda: app.theme != theme, what="the theme toggled")
        await pilot.press("1")
        await wait_until(pilot, shows(app, "s0"), what="the sessions tab")
        assert app._exception is None
