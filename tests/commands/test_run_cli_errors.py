"""`askspec run` refuses bad input with one clear line and exit code 1, never a traceback,
and without creating a run directory it could not use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "askspec.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, message", [
    (["run", "missing.ask"], "cannot read missing.ask"),
    (["run", "specs/ask_e.ask", "--replay", "/nonexistent/replay.json"], "does not exist"),
    (["run", "specs/ask_e.ask", "--model", "nobody=hf:x"], "no role named 'nobody'"),
    (["run", "specs/ask_e.ask", "--set", "probes=many"], "E111"),
    (["run", "--resume", "specs"], "not a run directory"),
    (["run"], "give a spec file"),
    (["compile", "specs/ask_e.ask", "-o", "/nonexistent/dir/out.json"], "cannot write"),
])
def test_bad_input_is_one_clear_error(tmp_path, args, message):
    proc = _run(*args, *(["--out", str(tmp_path)] if args[0] == "run" and "--resume" not in args else []))
    assert proc.returncode == 1
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("*")), "no run directory for a run that never started"


def test_bad_replay_file_is_refused_before_the_run(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"sessions": 3}')
    out = tmp_path / "runs"
    proc = _run("run", "specs/ask_e.ask", "--replay", str(bad), "--out", str(out))
    assert proc.returncode == 1 and "must be a list" in proc.stderr
    assert not out.exists()


def test_os_errors_name_the_path_in_one_sentence(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    replay = tmp_path / "r.json"
    replay.write_text('{"sessions": []}')
    for out, message in [(afile, f"--out {afile} is a file"),
                         (afile / "sub", f"cannot create a run directory in {afile / 'sub'}: not a directory")]:
        proc = _run("run", "specs/ask_e.ask", "--eval-only", "--replay", str(replay), "--out", str(out))
        assert proc.returncode == 1
        assert message in proc.stderr and "[Errno" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
