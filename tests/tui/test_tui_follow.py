"""Follow mode against a run that another process is writing (``RunWriter`` in a
subprocess): new sessions appear as they are written and the cursor stays on the newest,
the table keeps focus and does not jump, moving the cursor up pauses following while a
badge counts what arrived, ``f`` catches up, and a running session's transcript grows
as its turns arrive. Every wait polls for its condition (the machine may be loaded)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import askspec

from askspec.tui.app import AskspecApp
from askspec.tui.components.table import ArrowTable
from askspec.tui.components.vtable import VirtualTable
from askspec.tui.screens.run import RunScreen
from askspec.tui.screens.transcript import TranscriptScreen

from tui_helpers import screen_text, wait_until

# s0000 stays running and gets a turn each step; each step also plays one short session.
WRITER = r"""
import sys, time
from askspec.runtime.store.writer import RunWriter

w = RunWriter.create(sys.argv[1], experiment="live", experiment_hash="0" * 64, ir_json="{}",
                     spec_files={}, seed=0, roles={"r": {"model": "m"}}, params={}, planned_sessions=2000,
                     argv=sys.argv, flush_interval=0.02)
print(w.run_dir, flush=True)

def turn(sid, att, t, text):
    w.turn(sid, att, turn_index=t, role="r", model="m", prompt=[{"role": "user", "content": "q"}],
           text=text, parsed={}, finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=0.1)

live = w.session_started("s0000", game="g", group_id=None, params={}, index=0)
for i in range(1, 2000):  # ~5 min: outlasts the test on a loaded machine (killed at the end)
    turn("s0000", live, i - 1, f"live turn {i - 1}")
    sid = f"s{i:04d}"
    a = w.session_started(sid, game="g", group_id=None, params={"i": i}, index=i)
    turn(sid, a, 0, f"reply {i}")
    w.session_finished(sid, a, status="ok", outcome="done", error=None, vars={})
    w.flush()
    time.sleep(float(sys.argv[2]))
w.finish()
"""


def _count(app) -> int:
    m = re.search(r"(\d+) sessions?", screen_text(app).split("Sessions [1]")[-1])
    return int(m.group(1)) if m else -1


def _turns(app) -> int:
    m = re.search(r"(\d+) turns", screen_text(app))
    return int(m.group(1)) if m else -1


def _newest_in_view(app) -> int:
    return max((int(n) for n in re.findall(r"live turn (\d+)", screen_text(app))), default=-1)


def _table_focused(app) -> bool:
    return isinstance(app.focused, VirtualTable) and app.focused.parent.id == "sessions"


async def test_follow_a_run_another_process_writes(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(askspec.__file__).parent.parent),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs"), "0.15"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        run_dir = proc.stdout.readline().strip()
        assert run_dir, proc.stderr.read()
        app = AskspecApp(tmp_path / "runs", follow_interval=0.3)
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_until(pilot, lambda: "● running" in screen_text(app), what="the live run")
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and _count(app) > 0)
            table = app.screen.query_one("#sessions", ArrowTable)
            inner = table._table
            first = _count(app)

            # new sessions arrive; the cursor follows the newest row; the table widget
            # stays (updated in place) and keeps focus
            await wait_until(pilot, lambda: _count(app) >= first + 5, timeout=30, what="new sessions arriving")
            await wait_until(pilot, lambda: f"s{_count(app) - 1:04d}" in screen_text(app), timeout=30,
                             what="the newest row on screen")
            assert "● following" in screen_text(app)
            assert table._table is inner
            assert _table_focused(app)
            assert table.cursor_row == table.row_count - 1

            # scroll away: following pauses, the table stays as it was, the badge counts arrivals
            await pilot.press("home")
            await wait_until(pilot, lambda: re.search(r"paused: \+([1-9]\d*) new", screen_text(app)) is not None,
                             timeout=30, what="the paused badge")
            shown = _count(app)
            await wait_until(pilot, lambda: int(re.search(r"paused: \+(\d+) new", screen_text(app)).group(1)) >= 3,
                             timeout=30, what="more arrivals counted")
            assert _count(app) == shown and table.cursor_row == 0 and "s0000" in screen_text(app)
            assert _table_focused(app)

            # f catches up and follows again
            await pilot.press("f")
            await wait_until(pilot, lambda: _count(app) > shown and "● following" in screen_text(app),
                             timeout=30, what="catching up")
            await wait_until(pilot, lambda: table.cursor_row == table.row_count - 1, timeout=30,
                             what="the cursor on the newest row")
            assert table._table is inner and _table_focused(app)

            # the running session's transcript grows as its turns are written
            await pilot.press("home")
            await wait_until(pilot, lambda: table.cursor_row == 0)
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, TranscriptScreen) and _turns(app) > 0,
                             timeout=30, what="the running session's transcript")
            assert "running" in screen_text(app)
            opened = _turns(app)
            await wait_until(pilot, lambda: _turns(app) >= opened + 3, timeout=30, what="new turns arriving")
            # at the end (G), the view stays on the newest turn as more arrive
            await pilot.press("G")
            at_end = _turns(app)
            await wait_until(pilot, lambda: _turns(app) >= at_end + 3, timeout=30, what="more turns arriving")
            # (the view may trail the header's count by the turns of a load or two on a
            # loaded machine: what matters is that it moves on with them)
            await wait_until(pilot, lambda: _newest_in_view(app) >= at_end + 3, timeout=30,
                             what="newer turns in view")
    finally:
        proc.kill()
        proc.wait()
