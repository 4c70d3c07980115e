"""Snapshot tests (pytest-textual-snapshot) of the main screens over hand-built runs
with frozen ids and times. After an intended change of the UI, review and accept with
``pytest tests/tui/test_tui_snapshots.py --snapshot-update``."""

from __future__ import annotations

import pytest

from askspec.tui.app import AskspecApp

from tui_helpers import demo_runs, screen_text, wait_until  # noqa: F401 (fixture)

SIZE = (130, 36)


@pytest.fixture
def demo_app(demo_runs, monkeypatch):
    monkeypatch.chdir(demo_runs.parent)  # the title shows the path as given: keep it stable
    return AskspecApp("runs", follow_interval=3600)


async def _ready(pilot, text: str) -> None:
    """Wait for ``text``, and for what arrives in a second step: the runs' counts, the
    sessions' reward columns."""
    def settled() -> bool:
        shown = screen_text(pilot.app)
        if "Runs in" in shown and shown.count("6/6") < 2:
            return False
        return text in shown and "reading rewards" not in shown
    await wait_until(pilot, settled, what=text)
    await pilot.pause(0.3)


def test_runs_screen(snap_compare, demo_app):
    async def run_before(pilot):
        await _ready(pilot, "2 runs")
    assert snap_compare(demo_app, terminal_size=SIZE, run_before=run_before)


def test_sessions_screen(snap_compare, demo_app):
    async def run_before(pilot):
        await _ready(pilot, "2 runs")
        await pilot.press("enter")
        await _ready(pilot, "6 sessions")
    assert snap_compare(demo_app, terminal_size=SIZE, run_before=run_before)


def test_transcript_screen(snap_compare, demo_app):
    async def run_before(pilot):
        await _ready(pilot, "2 runs")
        await pilot.press("enter")
        await _ready(pilot, "6 sessions")
        await pilot.press("down", "down", "enter")
        await _ready(pilot, "vars: missing_question=true")
        await pilot.press("G")  # (the head's vars line pushed the recovery turns below the fold)
        await _ready(pilot, "⟲ recovery")
    assert snap_compare(demo_app, terminal_size=SIZE, run_before=run_before)


def test_groups_screen(snap_compare, demo_app):
    async def run_before(pilot):
        await _ready(pilot, "2 runs")
        await pilot.press("enter")
        await _ready(pilot, "6 sessions")
        await pilot.press("2")
        await _ready(pilot, "Comparing both traces")
    assert snap_compare(demo_app, terminal_size=SIZE, run_before=run_before)


def test_metrics_screen(snap_compare, demo_app):
    async def run_before(pilot):
        await _ready(pilot, "2 runs")
        await pilot.press("enter")
        await _ready(pilot, "6 sessions")
        await pilot.press("3")
        await _ready(pilot, "calibration_rate  a=mid, b=large")  # (the key curves first, then the declared metrics)
    assert snap_compare(demo_app, terminal_size=SIZE, run_before=run_before)
