"""docs/tutorial.md runs as written: its files are written from the page, each command
it shows is run (and must succeed), the output it shows is in the command's output, and
its TUI steps show what the page says.

Markers in the page (HTML comments, invisible when rendered): ``<!-- file: NAME -->``
before a code block (written to NAME), ``<!-- run -->`` before a bash block (each line a
command, run in the tutorial's folder), ``<!-- output -->`` before a text block (each
line is in the output of the commands before it, spaces and run ids aside),
``<!-- tui: KEYS -->`` before a bash block opening the TUI (KEYS pressed: key names, ``/``,
or text typed) and ``<!-- screen -->`` before a text block (each line is on the screen)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from askspec.tui.app import AskspecApp

from tui_helpers import ROOT, screen_text, wait_until

PAGE = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"<!-- (file: [^>]+|run|output|screen|tui: [^>]+) -->\n```\w*\n(.*?)```", re.S)
RUN_ID = re.compile(r"\d{8}-\d{6}-debate-[0-9a-f]{6}")
KEYS = {"enter", "escape", "tab", "up", "down", "home", "end", "pagedown", "pageup", "space"}


def _norm(text: str) -> str:
    return " ".join(RUN_ID.sub("RUN", text).split())


def _steps() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(PAGE.read_text(encoding="utf-8"))]


def test_the_page_has_every_kind_of_step():
    kinds = {k.split(":")[0] for k, _ in _steps()}
    assert kinds == {"file", "run", "output", "screen", "tui"}


async def test_the_tutorial_runs_as_written(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    output = ""
    tui_path = None
    for kind, body in _steps():
        if kind.startswith("file: "):
            (tmp_path / kind.removeprefix("file: ").strip()).write_text(body, encoding="utf-8")
        elif kind == "run":
            output = ""
            for line in body.splitlines():
                if not line.strip() or line.startswith("#"):
                    continue
                proc = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True,
                                      text=True, timeout=300)
                assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
                output += proc.stdout + proc.stderr
        elif kind == "output":
            for line in body.splitlines():
                if line.strip():
                    assert _norm(line) in _norm(output), f"not in the output: {line!r}\n{output}"
        elif kind.startswith("tui: "):
            command = body.split()
            assert command[:2] == ["askspec", "tui"], body
            tui_path = tmp_path / command[2]
            keys = kind.removeprefix("tui: ").split()
        elif kind == "screen":
            assert tui_path is not None
            app = AskspecApp(tui_path, follow_interval=3600)
            lines = [line for line in body.splitlines() if line.strip()]
            async with app.run_test(size=(160, 40)) as pilot:
                await wait_until(pilot, lambda: "1 run" in screen_text(app) and "3/3" in screen_text(app))
                for key in keys:
                    if key in KEYS:
                        await pilot.press(key)
                        await pilot.pause(0.5)
                    elif key == "/":
                        await pilot.press("slash")
                    else:
                        await pilot.press(*key)
                await wait_until(pilot, lambda: all(line in screen_text(app) for line in lines),
                                 what=f"the screen the page shows: {lines}")
