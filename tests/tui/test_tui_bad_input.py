"""Runs and paths that are not what they should be open without a traceback and say
what is wrong: an empty run, a run whose sessions all errored, a torn last line, a
folder with no runs, a path that does not exist."""

from __future__ import annotations

from askspec.runtime.store.writer import RunWriter
from askspec.tui.app import AskspecApp
from askspec.tui.screens.message import MessageScreen
from askspec.tui.screens.run import RunScreen

from tui_helpers import ROOT, demo_runs, screen_text, shows, wait_until  # noqa: F401 (fixture)

SIZE = (140, 40)


def _empty_run(out):
    w = RunWriter.create(out, experiment="empty", experiment_hash="0" * 64, ir_json="{}", spec_files={}, seed=0,
                         roles={"r": {"model": "m"}}, params={}, planned_sessions=4, argv=["askspec"])
    w.finish("finished")
    return w.run_dir


async def test_missing_path_says_so(tmp_path):
    app = AskspecApp(tmp_path / "nope")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "no such directory"))
        assert isinstance(app.screen, MessageScreen)
        await pilot.press("q")


async def test_file_instead_of_folder(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    app = AskspecApp(f)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "not a directory"))


async def test_folder_without_runs(tmp_path):
    app = AskspecApp(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "no runs in", "askspec run SPEC"))


async def test_empty_run_opens_with_no_sessions(tmp_path):
    run_dir = _empty_run(tmp_path / "runs")
    app = AskspecApp(run_dir)  # a run directory itself opens straight into the run
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and "no sessions yet" in screen_text(app))
        await pilot.press("2")
        await wait_until(pilot, shows(app, "this run has no groups"))
        await pilot.press("3")
        await wait_until(pilot, shows(app, "no readable ir.json"))


async def test_run_whose_sessions_all_errored(tmp_path):
    from askspec.runtime.commands.run import run_spec

    rc, run_dir = await (run_spec(str(ROOT / "specs" / "reasoning_arena.ask"), eval_only=True, out=str(tmp_path), sessions=4,
                                       model=["policy=python:fake_models:fails", "judge=python:fake_models:fails"]))
    app = AskspecApp(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "error 8"))
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "errors 8", "policy: model call failed"))
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "error: policy: model call failed"))


async def test_torn_last_line_is_ignored_with_a_warning(tmp_path, demo_runs):
    import shutil

    run_dir = tmp_path / "runs" / "torn"
    shutil.copytree(next(demo_runs.iterdir()), run_dir)
    with open(run_dir / "events" / "sessions.ndjson", "ab") as f:
        f.write(b'{"seq": 999, "event": "started", "session_id": "s9')
    app = AskspecApp(tmp_path / "runs")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, shows(app, "partial line", "6/6"))
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "6 sessions"))
        assert "s9" not in screen_text(app).split("6 sessions")[1]
