"""The main job, small: Ask-E on the embedded hf backend (real SmolLM2 on the CPU),
one session with one probing round and short replies (8 tokens), recorded and queryable.
`--verbose` is checked on a one-ask spec on the same model: what it shows is the
libraries' output while the model loads, not a game's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _clean_env() -> dict:
    """The user's environment, without settings that quieten the libraries themselves."""
    quiet = {"TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "ASKSPEC_DEBUG"}
    return {k: v for k, v in os.environ.items() if k not in quiet}


@pytest.mark.slow
def test_ask_e_runs_on_smollm2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "run", "specs/ask_e.ask", "--eval-only", "--sessions", "1",
                           "--set", "probes=1", "--max-tokens", "8", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # one askspec line for the model, none of the libraries' progress bars or warnings
    assert "preparing hf model smollm2-135m-instruct (policy, role questioner) ... ready in" in proc.stderr
    for noise in ("it/s", "Loading weights", "GGUF", "[transformers]", "Warning", "%|"):
        assert noise not in proc.stderr, proc.stderr
    run_dir = proc.stdout.strip().splitlines()[-1]
    from askspec.runtime.store.views import open_store

    con = open_store(run_dir)
    status, outcome = con.execute("select status, outcome from sessions").fetchone()
    assert status == "ok" and outcome in ("calibrated", "too_easy", "too_hard")
    turns = con.execute("select role, model, finish_reason, tokens_in, tokens_out, text from turns").fetchall()
    assert {t[0] for t in turns} >= {"questioner"}
    for role, model, finish, tin, tout, text in turns:
        assert finish in ("stop", "length") and tin > 0 and 0 < tout <= 8
        assert isinstance(text, str)
    manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["roles"]["questioner"]["model"] == "policy"


@pytest.mark.slow
def test_verbose_shows_the_libraries_output(tmp_path):
    spec = tmp_path / "one_ask.ask"  # one call to the embedded model, as Ask-E's questioner makes them
    spec.write_text('experiment e { param n: int = 1 }\n'
                    'model m = hf("smollm2-135m-instruct")\n'
                    'role r { model = m; prompt = "Say hi." }\n'
                    'game g for i in range(0, n) { x = ask r }\n')
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(spec), "--max-tokens", "2",
                           "--out", str(tmp_path / "runs"), "--verbose", "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "Loading weights" in proc.stderr  # transformers' own progress bar
