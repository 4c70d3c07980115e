"""Paths and the CLI runner shared by the language tests (imported by name: a module named
`conftest` would be whichever folder's conftest.py pytest loaded last when several test
folders run in one invocation)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.ask"))
# the specs plus a fixture that uses every construct of the language
EXAMPLES = SPECS + [Path(__file__).parent / "fixtures" / "all_constructs.ask"]


def run_cli(*args: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `askspec ARGS` in a fresh interpreter (as a user would)."""
    env = {k: v for k, v in os.environ.items() if k != "ASKSPEC_DEBUG"}
    return subprocess.run([sys.executable, "-m", "askspec.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
