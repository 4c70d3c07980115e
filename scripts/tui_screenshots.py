"""Regenerate the SVG screenshots in docs/tui/ (Textual's ``App.save_screenshot``) from
the hand-built demo runs the snapshot tests use.

    .venv/bin/python scripts/tui_screenshots.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tui"))

from tui_helpers import build_demo_run  # noqa: E402

from askspec.tui.app import AskspecApp  # noqa: E402

SHOTS = [  # (file, keys pressed after the previous shot, text to wait for)
    ("runs.svg", [], "questioner +"),  # (the counts and rewards come after the run list)
    ("sessions.svg", ["enter"], "questioner  started"),  # (the reward columns after the rows)
    ("transcript.svg", ["enter"], "→ forwarded to"),
    ("groups.svg", ["escape", "2"], "Comparing both traces"),
    ("metrics.svg", ["3"], "a=mid, b=large"),  # (the declared metrics, below the key curves)
    ("sql.svg", ["4", *"select outcome, count(*) AS n from sessions group by all order by n desc", "enter"],
     "rows in"),
]


async def main() -> None:
    out = ROOT / "docs" / "tui"
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        build_demo_run(runs, "20260102-030405-ask_e-demo01")
        build_demo_run(runs, "20260102-030406-ask_e-demo02")
        os.chdir(tmp)  # the runs screen's title shows the path as given
        app = AskspecApp("runs", follow_interval=3600)
        async with app.run_test(size=(120, 34)) as pilot:
            for name, keys, ready in SHOTS:
                await pilot.press(*keys)
                deadline = time.monotonic() + 30
                while ready not in "\n".join(s.text for s in app.screen._compositor.render_strips()):
                    if time.monotonic() > deadline:
                        raise TimeoutError(name)
                    await pilot.pause(0.05)
                await pilot.pause(0.3)
                app.title = "askspec"
                app.save_screenshot(name, str(out))
                print(out / name)


if __name__ == "__main__":
    asyncio.run(main())
