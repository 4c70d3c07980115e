"""Headless core: the runtime, the store and the CLI's non-TUI commands never import
Textual (nor askspec.tui); only `askspec tui` does."""

from __future__ import annotations

import subprocess
import sys

CHECK = r"""
import sys
import askspec.runtime
from askspec.runtime.store import views, writer, layout, compact
from askspec.runtime.engine import session, metrics, routing
from askspec.runtime.commands import query, run, metrics as metrics_cmd
from askspec.cli import build_parser
build_parser()  # every non-TUI subcommand registered
import askspec.tui.data, askspec.tui.filters, askspec.tui.shaping  # the TUI's data layer is headless too
bad = sorted(m for m in sys.modules if m == "textual" or m.startswith(("textual.", "textual_", "askspec.tui.app",
                                                                       "askspec.tui.screens", "askspec.tui.components")))
print(",".join(bad))
"""


def test_runtime_and_cli_never_import_textual():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"imported: {out.stdout.strip()}"


def test_cli_query_runs_without_textual(tmp_path):
    code = ("import sys; from askspec.cli import main; main(['runs', sys.argv[1]]); "
            "print('TEXTUAL' if 'textual' in sys.modules else 'clean')")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("clean"), out.stdout + out.stderr


def test_tui_subcommand_is_registered():
    from askspec.cli import build_parser

    args = build_parser().parse_args(["tui", "some/runs"])
    assert args.path == "some/runs" and args.func.__name__ == "cmd_tui"
    assert build_parser().parse_args(["tui"]).path == "runs"
