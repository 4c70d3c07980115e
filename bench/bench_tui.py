"""TUI benchmark: time to first paint of the sessions table and time to open a
transcript, on a generated 100k-session, 1M-turn Ask-E-shaped run.

The run is written with ``bench_store.write_run`` (the real RunWriter), then the app is
driven headless (``App.run_test``): "first paint" is from pressing Enter on the run to
the sessions table being on screen with its rows; "open a transcript" is from pressing
Enter on a session to its turns being on screen. Both are measured on the live NDJSON
files and again after ``compact_run`` (Parquet, what a finished run should be).

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


async def _until(pilot, cond, timeout=120.0) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if cond():
            return
        await pilot.pause(0.005)
    raise TimeoutError(_text(pilot.app))


async def measure(runs: Path, sessions: int) -> dict[str, float]:
    from askspec.tui.app import AskspecApp
    from askspec.tui.screens.transcript import TranscriptScreen

    app = AskspecApp(runs, follow_interval=3600)
    out = {}
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: "ask_e_bench" in _text(app))
        t0 = time.perf_counter()
        await pilot.press("enter")
        await _until(pilot, lambda: f"{sessions} sessions" in _text(app) and "s0000000" in _text(app))
        out["first paint"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(20):
            await pilot.press("pagedown")
        await _until(pilot, lambda: "s0000" in _text(app))
        out["20 page-downs"] = time.perf_counter() - t0
        await pilot.press("ctrl+home")
        await pilot.pause(0.2)
        t0 = time.perf_counter()
        await pilot.press("enter")
        await _until(pilot, lambda: isinstance(app.screen, TranscriptScreen) and "t9 " in _text(app)
                     or isinstance(app.screen, TranscriptScreen) and "t3 " in _text(app))
        out["open transcript"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench_tui_"))
    print(f"# bench_tui  {time.strftime('%Y-%m-%d %H:%M')}  python {platform.python_version()}  "
          f"{os.cpu_count()} cpus  load {os.getloadavg()[0]:.1f}")
    try:
        runs = tmp / "runs"
        run_dir, info = write_run(runs, args.sessions, args.turns, 0.2)
        print(f"run: {args.sessions} sessions, {info['turns']} turns, {info['bytes'] / 1e9:.2f} GB NDJSON "
              f"(written in {info['seconds']:.1f} s)")
        for label in ("NDJSON", "Parquet"):
            if label == "Parquet":
                compact_run(run_dir)
            rows = [asyncio.run(measure(runs, args.sessions)) for _ in range(args.repeat)]
            for key in rows[0]:
                vals = [r[key] for r in rows]
                print(f"{label:8s} {key:16s} median {statistics.median(vals):.3f} s  "
                      f"(runs: {', '.join(f'{v:.3f}' for v in vals)})")
        print(f"load at end {os.getloadavg()[0]:.1f}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
