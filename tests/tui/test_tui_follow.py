"""Follow mode: a run that another process is writing shows new sessions within about
a second; moving the cursor up pauses following and a badge counts what arrived; `f`
catches up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import askspec
import pytest
from askspec.tui.app import AskspecApp
from askspec.tui.screens.run import RunScreen

from tui_helpers import screen_text, wait_until

WRITER = r"""
import sys, time
from askspec.runtime.store.writer import RunWriter

w = RunWriter.create(sys.argv[1], experiment="live", experiment_hash="0" * 64, ir_json="{}",
                     spec_files={}, seed=0, roles={"r": {"model": "m"}}, params={}, planned_sessions=200,
                     argv=sys.argv, flush_interval=0.02)
print(w.run_dir, flush=True)
for i in range(200):
    sid = f"s{i:04d}"
    a = w.session_started(sid, game="g", group_id=None, params={"i": i}, index=i)
    w.turn(sid, a, turn_index=0, role="r", model="m", prompt=[{"role": "user", "content": "q"}],
           text=f"reply {i}", parsed={}, finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=0.1)
    w.session_finished(sid, a, status="ok", outcome="done", error=None, vars={})
    w.flush()
    time.sleep(float(sys.argv[2]))
w.finish()
"""


def _count(app) -> int:
    m = re.search(r"(\d+) sessions?", screen_text(app).split("Sessions [1]")[-1])
    return int(m.group(1)) if m else -1


@pytest.mark.xfail(reason="under heavy load the sessions table is remounted on every update and can lose "
                          "focus to the filter box mid-follow; appending rows in place is the fix (open)",
                   strict=False)
async def test_follow_a_run_another_process_writes(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(askspec.__file__).parent.parent),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs"), "0.3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        run_dir = proc.stdout.readline().strip()
        assert run_dir, proc.stderr.read()
        app = AskspecApp(tmp_path / "runs", follow_interval=0.3)
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_until(pilot, lambda: "● running" in screen_text(app), what="the live run")
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and _count(app) > 0)
            first = _count(app)
            await wait_until(pilot, lambda: _count(app) >= first + 5, what="new sessions arriving")
            assert "● following" in screen_text(app)
            # the view follows the newest row as it arrives
            await wait_until(pilot, lambda: f"s{_count(app) - 1:04d}" in screen_text(app), what="the newest row")
            # scroll away: following pauses, the badge counts arrivals, the table stays
            await pilot.press("home")
            await wait_until(pilot, lambda: re.search(r"paused: \+([1-9]\d*) new", screen_text(app)) is not None,
                             what="the paused badge")
            shown = _count(app)
            await pilot.pause(0.6)
            assert _count(app) == shown
            arrived = int(re.search(r"paused: \+(\d+) new", screen_text(app)).group(1))
            assert arrived >= 1
            await pilot.press("f")
            await wait_until(pilot, lambda: _count(app) >= shown + arrived and "● following" in screen_text(app),
                             what="catching up")
    finally:
        proc.kill()
        proc.wait()
