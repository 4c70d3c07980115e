"""The app driven with ``App.run_test`` and Pilot over runs askspec made itself (Ask-E
on the replay backend, Reasoning Arena on the Python fake models); every test asserts on
what is on screen."""

from __future__ import annotations

import pytest

from askspec.tui.app import AskspecApp
from askspec.tui.screens.compare import CompareScreen
from askspec.tui.screens.run import RunScreen
from askspec.tui.screens.transcript import TranscriptScreen

from tui_helpers import real_runs, screen_text, shows, type_text, wait_until  # noqa: F401 (fixture)

SIZE = (150, 45)


async def open_run(pilot, app, experiment: str) -> None:
    """From the runs screen, move to the first run of ``experiment`` and press Enter."""
    await wait_until(pilot, shows(app, experiment), what="the runs table")
    rows = [r.experiment for r in app.known_runs] if app.known_runs else None
    screen = app.screen
    index = [r.experiment for r in screen.runs].index(experiment)
    for _ in range(index):
        await pilot.press("down")
    await pilot.press("enter")
    await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and "session" in screen_text(app),
                     what=f"the {experiment} run")
    del rows


async def test_runs_folder_lists_runs_with_status_counts_and_rewards(real_runs):
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "ask_e", "reasoning_arena"), what="both runs")
        # counts and rewards are read by a worker after the names are listed
        await wait_until(pilot, shows(app, "3/3", "8/8", "questioner +"), what="the runs' counts")
        text = screen_text(app)
        assert "Runs in" in text and "2 runs" in text
        assert "3/3" in text and "8/8" in text  # sessions done / planned
        assert "calibrated 1" in text and "too_easy 1" in text and "too_hard 1" in text
        assert "questioner +" in text  # mean reward per role
        assert "finished" in text


async def test_open_run_filter_sessions_and_sort(real_runs):
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await open_run(pilot, app, "ask_e")
        await wait_until(pilot, shows(app, "s000000", "s000001", "s000002", "3 sessions"))
        await pilot.press("slash")
        await type_text(pilot, "outcome:too_easy")
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "1 session", "matching 'outcome:too_easy'"))
        text = screen_text(app)
        assert "s000002" in text and "s000000" not in text and "s000001" not in text
        # full-text search over turn texts
        app.screen.query_one("#filter").value = ""
        await pilot.press("slash")
        await type_text(pilot, '"What is 2+2"')
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "1 session", "s000000"))
        assert "s000002" not in screen_text(app)
        # a reward range on a role, and a bad filter shown inline
        app.screen.query_one("#filter").value = ""
        await pilot.press("slash")
        await type_text(pilot, "role:questioner reward:..0")
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "1 session", "s000001"))
        app.screen.query_one("#filter").value = ""
        await pilot.press("slash")
        await type_text(pilot, "reward:abc")
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "not a number"))
        app.screen.query_one("#filter").value = ""
        await pilot.press("slash", "enter")
        await wait_until(pilot, shows(app, "3 sessions"))
        # (letters typed right after a filter go on into the filter box: a key on the
        # table first, then s is the sort key)
        await pilot.press("home", "s")  # sort by the first column
        await wait_until(pilot, shows(app, "sorted by #"))


async def test_transcript_shows_forwarded_question_rewards_and_recovery(real_runs):
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await open_run(pilot, app, "ask_e")
        await wait_until(pilot, shows(app, "s000000"))
        await pilot.press("enter")  # the first session: calibrated
        await wait_until(pilot, lambda: isinstance(app.screen, TranscriptScreen) and "t0" in screen_text(app))
        # the first turns paint first; the rest and the rewards are mounted after
        # (waited for whole: a line seen half-drawn under load is not yet a failure)
        await wait_until(pilot, shows(app, "→ forwarded to boundary_a t1 (question), boundary_b t2 (question)",
                                      "terminal rewards:"), what="the whole transcript")
        text = screen_text(app)
        assert "outcome calibrated" in text
        assert "What is 2+2?" in text  # the #Question# the questioner wrote...
        assert "→ forwarded to boundary_a t1 (question), boundary_b t2 (question)" in text
        assert "← sent (questioner t0 question): What is 2+2?" in text  # ...and what the boundary got
        assert "terminal rewards: questioner calibration=+1" in text
        assert "▶ prompt (" in text  # collapsed prompt
        assert "[system]" not in text
        # p opens every prompt as sent (its messages, by role), p again closes them
        await pilot.press("p")
        await wait_until(pilot, shows(app, "▼ prompt (", "[system]"), what="the prompts opened")
        assert "▶ prompt (" not in screen_text(app)
        await pilot.press("p")
        await wait_until(pilot, lambda: "[system]" not in screen_text(app), what="the prompts closed")
        # a click on a prompt line opens that prompt alone
        view = app.screen.query_one("#turns")
        line = next(y for y in range(view.size.height) if "▶ prompt (" in view.render_line(y).text)
        await pilot.click("#turns", offset=(6, line))
        await wait_until(pilot, shows(app, "▼ prompt (", "[system]"), what="one prompt opened")
        await pilot.press("G")  # the last turn's prompt stays closed
        await wait_until(pilot, shows(app, "▶ prompt ("), what="the other prompts closed")
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen))
        # the next session in the same (reused) screen: its own turns, none of the first's
        await pilot.press("down")
        await wait_until(pilot, lambda: app.transcripts.get((app.screen.run.run_id, "s000001")) is not None,
                         what="the transcript of the row the cursor rests on, read ahead")
        await pilot.press("enter")  # s000001: the recovery prompt
        await wait_until(pilot, lambda: isinstance(app.screen, TranscriptScreen) and "t0" in screen_text(app))
        text = screen_text(app)
        assert "s000001" in text and "What is 2+2?" not in text and "▼ prompt (" not in text
        await pilot.press("G")
        await wait_until(pilot, shows(app, "⟲ recovery"), what="the recovery turn")
        assert "✗ unparsed" in screen_text(app)


async def test_group_matches_route_and_strengths(real_runs):
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await open_run(pilot, app, "reasoning_arena")
        await pilot.press("2")
        await wait_until(pilot, shows(app, "route: tournament:arena", "shown first"), what="the group's matches")
        text = screen_text(app)
        assert "var 0" in text  # the statistics the route looked at
        assert "arm fired: route policy { else -> tournament arena }" in text
        assert "Response A is better" in text  # the judge's reply
        assert "strength" in text and "routed" in text


async def test_metrics_tab_tables_and_pair_heatmap(real_runs):
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await open_run(pilot, app, "ask_e")
        await pilot.press("3")
        await wait_until(pilot, shows(app, "calibration_rate", "by (a, b)"), what="metrics")
        text = screen_text(app)
        assert "boundary_small" in text and "0.33" in text


async def test_sql_console_result_error_and_history(real_runs):
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await open_run(pilot, app, "ask_e")
        await pilot.press("4")
        await wait_until(pilot, lambda: app.focused is not None and app.focused.id == "sql")
        await type_text(pilot, "select outcome, count(*) as n from sessions where run_id like '%ask_e%' group by all order by outcome")
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "3 rows in", "too_easy"), what="the query's result")
        await type_text(pilot, "select nope from sessions")
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "⚠", "nope"), what="the inline error")
        assert isinstance(app.screen, RunScreen)  # no crash
        assert "too_easy" in screen_text(app)  # the last good result stays
        app.screen.query_one("#sql").value = ""
        await pilot.press("up", "up")
        assert app.screen.query_one("#sql").value.startswith("select outcome")


async def test_sql_console_sees_the_open_run_alone(real_runs):
    """The folder holds two runs (3 + 8 sessions); a run's SQL tab counts its own."""
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await open_run(pilot, app, "ask_e")
        await pilot.press("4")
        await wait_until(pilot, lambda: app.focused is not None and app.focused.id == "sql")
        assert "views over this run alone" in screen_text(app)
        app.screen.query_one("#sql").value = "select count(distinct run_id) as runs, count(*) as sessions_n from sessions"
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "1 row in", "sessions_n"), what="the query's result")
        lines = screen_text(app).splitlines()
        head = next(i for i, line in enumerate(lines) if line.split() == ["runs", "sessions_n"])
        assert lines[head + 1].split() == ["1", "3"]  # 1 run, 3 sessions (the folder: 2 runs, 11)


async def test_sql_console_is_read_only_and_confined(real_runs, tmp_path):
    """The console runs on the store's read-only path: COPY ... TO (which would write a
    file, even over the run's own events) and reading a file outside the run are refused
    inline; nothing is written."""
    target = tmp_path / "stolen.csv"
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await open_run(pilot, app, "ask_e")
        await pilot.press("4")
        await wait_until(pilot, lambda: app.focused is not None and app.focused.id == "sql")
        box = app.screen.query_one("#sql")
        box.value = f"COPY (SELECT * FROM turns) TO '{target}'"
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "⚠ COPY refused", "read-only"), what="the refusal")
        box.value = "SELECT * FROM read_csv('/etc/passwd')"
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "⚠ Permission Error", "file system operations are disabled"),
                         what="the confinement error")
        assert isinstance(app.screen, RunScreen)
    assert not target.exists()


async def test_compare_two_runs(real_runs):
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "ask_e", "reasoning_arena"))
        await pilot.press("space", "down", "space", "c")
        await wait_until(pilot, lambda: isinstance(app.screen, CompareScreen) and "B - A" in screen_text(app),
                         what="the comparison")
        await wait_until(pilot, shows(app, "mean reward questioner", "calibration_rate"), what="the compared values")
        text = screen_text(app)
        assert "mean reward questioner" in text and "mean reward policy" in text
        assert "calibration_rate" in text and "accuracy" in text


async def test_command_palette_opens_a_run(real_runs):
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "reasoning_arena"))
        await pilot.press("ctrl+p")
        await type_text(pilot, "open run reasoning")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen)
                         and "reasoning_arena" in screen_text(app), what="the run from the palette")


async def test_theme_toggle_and_key_help(real_runs):
    app = AskspecApp(real_runs)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "ask_e"))
        assert app.theme == "textual-dark"
        await pilot.press("t")
        assert app.theme == "textual-light"
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        assert app.screen.query("HelpPanel")


async def test_a_large_run_paints_its_first_sessions_before_reading_them_all(tmp_path, monkeypatch):
    """The first sessions (from the head of the sessions file) are on screen, and can be
    opened, while the whole file is still being read; then every session is shown."""
    import threading

    from askspec.tui import data

    from tui_helpers import _writer

    w = _writer(tmp_path / "runs", "big", planned_sessions=400)
    for i in range(400):
        sid = f"s{i:04d}"
        a = w.session_started(sid, game="g", group_id=None, params={}, index=i)
        w.turn(sid, a, turn_index=0, role="questioner", model="m", prompt=[], text=f"reply {i}", parsed={},
               finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=1.0)
        w.session_finished(sid, a, status="ok", outcome="done", error=None, vars={})
    w.finish()
    monkeypatch.setattr(data, "HEAD_BYTES", 16 << 10)
    release = threading.Event()
    whole = data.sessions_table

    def held_sessions_table(*args, **kw):  # (a stand-in: the whole read waits for the test)
        release.wait(30)
        return whole(*args, **kw)

    monkeypatch.setattr(data, "sessions_table", held_sessions_table)
    app = AskspecApp(tmp_path / "runs", follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "big"), what="the run")
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "the first ", " sessions  ·  reading all sessions", "s0000"),
                         what="the first page")
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, TranscriptScreen) and "reply 1" in screen_text(app),
                         what="a session of the first page")
        await pilot.press("escape")
        release.set()
        await wait_until(pilot, shows(app, "400 sessions"), what="every session")
        table = app.screen.query_one("#sessions")
        assert table.row_count == 400 and table.cursor_row == 1


async def test_metrics_tab_draws_training_curves(tmp_path):
    """A run with `train_steps` records: the metrics tab draws one curve per trained role
    and recorded column, over the steps, with the recorded values."""
    from askspec.tui.screens.metrics import TrainPlot

    from tui_helpers import _writer

    w = _writer(tmp_path / "runs", "trained_run", planned_sessions=1)
    a = w.session_started("s0", game="g", group_id=None, params={}, index=0)
    w.session_finished("s0", a, status="ok", outcome="done", error=None, vars={})
    losses = [0.9, 0.7, 0.55, 0.5, 0.42, 0.4]
    for step, loss in enumerate(losses, 1):
        w.train_step("questioner", step, {"loss": loss, "reward_mean": 0.1 * step, "lr": 1e-5, "tokens": 100 * step})
    w.finish()
    app = AskspecApp(tmp_path / "runs", follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "trained_run"), what="the run")
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        await pilot.press("3")
        await wait_until(pilot, lambda: bool(app.screen.query(TrainPlot)), what="the training curves")
        plots = {(p.curve.role, p.curve.column): p.curve.lines[0][1] for p in app.screen.query(TrainPlot)}
        assert plots[("questioner", "loss")] == list(enumerate(losses, 1))
        assert plots[("questioner", "reward_mean")] == [(s, 0.1 * s) for s in range(1, 7)]
        assert ("questioner", "tokens_per_s") not in plots  # (no `seconds` recorded: no rate)
        assert "no training records" not in screen_text(app)
        await wait_until(pilot, shows(app, "training", "questioner: loss"), what="the loss curve")
        # the curve itself: plotext's braille dots on screen
        assert any("\u2800" < ch <= "\u28ff" for ch in screen_text(app))
