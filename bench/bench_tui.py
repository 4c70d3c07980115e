"""TUI benchmark: time to first paint of the sessions table and time to open a
transcript, on a generated 100k-session, 1M-turn Ask-E-shaped run.

The run is written with ``bench_store.write_run`` (the real RunWriter), then the app is
driven headless (``App.run_test``), each repeat a fresh app (nothing cached):

- first paint: from Enter on the run to the sessions table on screen with its first
  rows (the first page, read from the head of the sessions file);
- all sessions: from the same Enter to the table holding every session (the run's
  sessions file read whole; reward columns not yet);
- reward columns: from the same Enter to the table showing each role's final reward;
- turns indexed: from the same Enter to the turn index being built (a worker does it
  after the reward columns; NDJSON only, a compacted run needs none);
- 20 page-downs;
- open a transcript: from Enter on a session (the first, then the last) to its turns
  on screen, once the index is built, Enter pressed as soon as the cursor is on the
  row: the whole read after Enter ("cold"); then the row above the last, Enter pressed
  after the cursor has rested on it for half a second ("rested": the app reads the
  transcript of the row the cursor rests on ahead, see ``askspec.tui.prefetch``; off
  for the cold ones);

and the same steps through the data layer alone (``measure_data``: what the app's
workers run), to tell the store's cost from the cost of drawing the screen.

Both on the live NDJSON files and after ``compact_run`` (Parquet, what a finished run
should be). The load average is printed: on a shared machine it matters.

    PYTHONPATH=<dir with askspec> python bench/bench_tui.py [--sessions 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_store import write_run  # noqa: E402

from askspec.runtime.store.compact import compact_run  # noqa: E402


def _text(app) -> str:
    return "\n".join(s.text for s in app.screen._compositor.render_strips())


async def _until(pilot, cond, shown=None, timeout=120.0) -> None:
    """Wait for ``cond()`` (cheap checks of the app's state, polled often), then for
    ``shown`` to be on screen (a render of the whole screen: checked once the state is
    there, as polling renders would slow the app being measured)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if cond() and (shown is None or (shown() if callable(shown) else shown) in _text(pilot.app)):
            return
        await pilot.pause(0.01)
    raise TimeoutError(_text(pilot.app))


async def _press_until(pilot, key: str, cond, shown: str, timeout: float = 120.0) -> float:
    """Seconds from pressing ``key`` to ``cond()`` holding with ``shown`` on screen,
    watched by a task beside the press: ``pilot.press`` itself returns only once the
    app is idle, which a worker still reading (the whole sessions file, the rewards)
    delays long after the screen has changed."""
    t0 = time.perf_counter()
    seen: list[float] = []

    async def watch() -> None:
        while True:
            if cond() and shown in _text(pilot.app):
                seen.append(time.perf_counter() - t0)
                return
            await asyncio.sleep(0.005)

    task = asyncio.create_task(watch())
    await pilot.press(key)
    await asyncio.wait_for(task, timeout)
    return seen[0]


async def measure(runs: Path, sessions: int, turns: int) -> dict[str, float]:
    from askspec.tui.app import AskspecApp
    from askspec.tui.components.table import ArrowTable
    from askspec.tui.screens.run import RunScreen
    from askspec.tui.screens.runs import RunsScreen
    from askspec.tui.screens.transcript import TranscriptScreen

    app = AskspecApp(runs, follow_interval=3600)
    out = {}
    last = f"s{sessions - 1:07d}"

    def table() -> ArrowTable | None:
        if not isinstance(app.screen, RunScreen):
            return None
        found = app.screen.query("#sessions").results(ArrowTable)
        return next(iter(found), None)  # (none while the screen is being composed)

    def painted() -> bool:
        t = table()
        return t is not None and t._table is not None and t.row_count > 0

    def all_rows() -> bool:
        t = table()
        return t is not None and t._table is not None and t.row_count == sessions

    def rewarded() -> bool:
        t = table()
        return t is not None and t.data is not None and "questioner" in t.data.column_names

    def indexed() -> bool:
        mirrors = list(app.source._mirrors.values())
        index = mirrors[0].turn_index if mirrors else None
        return bool(mirrors) and (index is None or (index.size > 0 and index.indexed >= index.size))

    def transcript_shown() -> bool:
        return isinstance(app.screen, TranscriptScreen) and app.screen.shown == turns

    async def open_transcript(key: str, sid: str, label: str, rest: float = 0.0) -> None:
        app.prefetch = bool(rest)  # (cold: none read ahead even if Enter came late on a loaded machine)
        await pilot.press(key)
        await _until(pilot, lambda: table().row(table().cursor_row)["session"] == sid)
        if rest:
            await pilot.pause(rest)
        out[f"open transcript ({label})"] = await _press_until(
            pilot, "enter", lambda: isinstance(app.screen, TranscriptScreen) and app.screen.shown > 0, "t0 ")
        await _until(pilot, transcript_shown, shown="t0 ")  # (all its turns, before going back)
        await pilot.press("escape")
        await _until(pilot, lambda: isinstance(app.screen, RunScreen))

    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: isinstance(app.screen, RunsScreen) and bool(app.screen.runs))
        t0 = time.perf_counter()
        out["first paint"] = await _press_until(pilot, "enter", painted, "s0000000")
        await _until(pilot, all_rows)
        out["all sessions"] = time.perf_counter() - t0
        await _until(pilot, rewarded, shown="questioner")
        out["reward columns"] = time.perf_counter() - t0
        await _until(pilot, indexed, timeout=600)
        out["turns indexed"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        for _ in range(20):
            await pilot.press("pagedown")
        await _until(pilot, lambda: table().cursor_row > 20 * 30,
                     shown=lambda: table().row(table().cursor_row)["session"])
        out["20 page-downs"] = time.perf_counter() - t1
        await open_transcript("home", "s0000000", "first, cold")
        await open_transcript("end", last, "last, cold")
        await open_transcript("up", f"s{sessions - 2:07d}", "rested", rest=0.5)
    return out


def measure_data(runs: Path, sessions: int) -> dict[str, float]:
    """The same steps through the data layer alone (what the app's workers run), on a
    fresh ``Source``: what the store costs, apart from drawing the screen."""
    from askspec.tui import data

    source = data.Source(runs)
    out = {}

    def timed(key, fn, *args, **kw):
        t0 = time.perf_counter()
        result = fn(*args, **kw)
        out[key] = time.perf_counter() - t0
        return result

    (run,) = timed("list runs", data.list_runs, source)
    timed("first page of sessions", data.first_sessions, source, run.run_id)
    table = timed("all sessions", data.sessions_table, source, run.run_id, rewards=False)
    assert table.num_rows == sessions
    timed("sessions with rewards", data.sessions_table, source, run.run_id)
    timed("index turns + warm", data.warm_run, source, run.run_id)
    for label, i in (("first", 0), ("middle", sessions // 2), ("last", sessions - 1)):
        tr = timed(f"transcript ({label})", data.transcript, source, run.run_id, f"s{i:07d}")
        assert tr.turns
    timed("runs' counts and rewards", data.summarize_runs, source)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--runs", type=Path, help="a folder holding one run written by an earlier --keep "
                                              "(its Parquet copies are made in place)")
    ap.add_argument("--parts", nargs="+", choices=("app", "data"), default=["app", "data"],
                    help="the app driven headless, the data layer alone (default: both)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench_tui_"))
    print(f"# bench_tui  {time.strftime('%Y-%m-%d %H:%M')}  python {platform.python_version()}  "
          f"{os.cpu_count()} cpus  load {os.getloadavg()[0]:.1f}")
    try:
        if args.runs:
            runs = args.runs
            (run_dir,) = [d for d in runs.iterdir() if d.is_dir()]
            print(f"run: {run_dir}")
        else:
            runs = tmp / "runs"
            run_dir, info = write_run(runs, args.sessions, args.turns, 0.2)
            print(f"run: {args.sessions} sessions, {info['turns']} turns, {info['bytes'] / 1e9:.2f} GB NDJSON "
                  f"(written in {info['seconds']:.1f} s) in {runs}")
        for label in ("NDJSON", "Parquet"):
            if label == "Parquet":
                t0 = time.perf_counter()
                compact_run(run_dir)
                print(f"compacted in {time.perf_counter() - t0:.1f} s")
            for what, fn in (("app", lambda: asyncio.run(measure(runs, args.sessions, args.turns))),
                             ("data", lambda: measure_data(runs, args.sessions))):
                if what not in args.parts:
                    continue
                rows = [fn() for _ in range(args.repeat)]
                for key in rows[0]:
                    vals = [r[key] for r in rows]
                    print(f"{label:8s} {what:5s} {key:26s} median {statistics.median(vals):.3f} s  "
                          f"(runs: {', '.join(f'{v:.3f}' for v in vals)})", flush=True)
        print(f"load at end {os.getloadavg()[0]:.1f}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
