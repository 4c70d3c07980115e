"""A reward that is NaN or infinite at run time ends its session in error, naming the
reward expression's file:line; nothing non-finite reaches the store and the run goes on
(issue #25, item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]  # tests/: fake_models and slow_model, the specs' python models

# i = 0: 0 - 0 = 0; i = 1: 1e308 * 10 overflows to inf, and inf - inf is nan; i = 2: inf
SPEC = """model m = python("fake_models:always_one")
role a { model = m; memory = none; prompt = "q" }
game g for i in range(0, 3) {
    x = ask a
    reward a = case { i == 2 -> 1e308 * 10 * i; else -> 1e308 * (10 * i) - 1e308 * (10 * i) }
}
"""


def test_nonfinite_reward_is_a_session_error_not_a_stored_nan(tmp_path: Path) -> None:
    spec = tmp_path / "nan.ask"
    spec.write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if k != "ASKSPEC_DEBUG"}
    env["PYTHONPATH"] = str(TESTS) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(spec), "--out", str(tmp_path / "runs")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir() and not d.name.startswith(".")]
    events = run_dir / "events"
    raw = (events / "rewards.ndjson").read_text() + (events / "sessions.ndjson").read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    rewards = [json.loads(line) for line in (events / "rewards.ndjson").read_text().splitlines()]
    assert [r["value"] for r in rewards] == [0.0]  # only the finite one is recorded
    finished = {e["session_id"]: e for e in map(json.loads, (events / "sessions.ndjson").read_text().splitlines())
                if e.get("event") == "finished"}
    assert [finished[s]["status"] for s in sorted(finished)] == ["ok", "error", "error"]
    for s in ("s000001", "s000002"):
        error = finished[s]["error"]
        assert error.startswith(f"{spec}:5:") and "not a finite number" in error, error
    assert "nan" in finished["s000001"]["error"] and "inf" in finished["s000002"]["error"]
    assert proc.returncode == 0, proc.stderr  # not every session failed: the run went on and finished
    assert "Traceback" not in proc.stderr
