"""Asynchronous rollouts end to end (`max_staleness = 1`, issue #26 item 3): step t + 1 is
played while step t's update runs, so its rollouts are sampled one update before the
weights they train; every rollout's recorded version is within the bound, and `kill -9` +
`--resume` trains every step exactly once and never on a rollout staler than the bound.
On the suite's tiny random Llama (tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.runtime.store.views import open_store

pytestmark = pytest.mark.slow  # builds a tiny model with SmolLM2's tokenizer (the converted GGUF)

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5
# the kill test's run: long enough that a kill polled every 0.2 s lands mid-run on an idle
# machine too (a tiny-model step takes ~0.1 s there; with 5 steps the run could end first)
KILL_STEPS = 20
SPEC = """model m = hf("{model}") {{ max_tokens = 3; temperature = 1.0 }}
role a {{ model = m; memory = none; prompt = "a + b"; trained }}
game g for i in range(0, 8) {{
    x = ask a
    reward a = len(x.text)
}}
train a with grpo {{ group = 2; steps = {steps}; save_every = 1; keep_checkpoints = 2; lr = 0.01; {extra} }}
"""


def spec(folder: Path, model: Path, extra: str = "max_staleness = 1", steps: int = STEPS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "t.ask"
    path.write_text(SPEC.format(model=model, steps=steps, extra=extra))
    return path


def versions(run: Path) -> tuple[list[tuple], list[tuple]]:
    """(step, rollout policy_version) of every rollout the views show, and (step, trained
    version, sampling version, stale share) of every train step."""
    con = open_store(run)
    rollouts = con.execute("SELECT step, policy_version FROM rollouts ORDER BY step").fetchall()
    steps = con.execute("SELECT step, (metrics->>'policy_version')::INT, (metrics->>'sampling_version')::INT, "
                        "(metrics->>'stale_share')::DOUBLE FROM train_steps ORDER BY step").fetchall()
    return rollouts, steps


def within_bound(rollouts: list[tuple], steps: list[tuple], k: int = 1) -> None:
    trained = {step: v for step, v, _, _ in steps}
    assert len(rollouts) == 2 * len(steps) and {s for s, _ in rollouts} == set(trained)
    for step, v in rollouts:
        assert trained[step] - k <= v <= trained[step], (step, v, trained[step])


def test_each_rollout_is_sampled_within_the_bound(tiny_model, tmp_path, e2e):
    run = e2e.run_to_end(spec(tmp_path, tiny_model), tmp_path / "runs")
    rollouts, steps = versions(run)
    within_bound(rollouts, steps)
    # step 1 is played before any update; step t ≥ 2 by the weights of before step t − 1's update
    assert sorted(set(rollouts)) == [(1, 0)] + [(t, t - 2) for t in range(2, STEPS + 1)]
    assert [(s, v, sv) for s, v, sv, _ in steps] == [(t, t - 1, max(0, t - 2)) for t in range(1, STEPS + 1)]
    assert [share for *_, share in steps] == [0.0] + [1.0] * (STEPS - 1)
    con = open_store(run)
    ratios = con.execute("SELECT (metrics->>'is_ratio_mean')::DOUBLE, (metrics->>'is_truncated_share')::DOUBLE "
                         "FROM train_steps ORDER BY step").fetchall()
    assert ratios[0] == (1.0, 0.0) and all(r > 0 and 0 <= share <= 1 for r, share in ratios)
    assert any(r != 1.0 for r, _ in ratios[1:])  # a stale step's weights differ from the sampler's


def test_kill_9_then_resume_trains_every_step_once_within_the_bound(tiny_model, tmp_path, e2e):
    out = tmp_path / "runs"
    e2e.kill_run_when(e2e.cmd("run", str(spec(tmp_path, tiny_model, steps=KILL_STEPS)), "--out", str(out), "--quiet"),
                      out,
                      lambda o: s if (s := e2e.latest_step(o)) is not None and s >= 2 else None, 300)
    run = e2e.only_run(out)
    killed_at = e2e.latest_step(out)
    assert killed_at is not None and killed_at < KILL_STEPS
    e2e.resume(run)
    rollouts, steps = versions(run)
    assert [s for s, *_ in steps] == list(range(1, KILL_STEPS + 1))  # every step exactly once
    assert [v for _, v, _, _ in steps] == list(range(KILL_STEPS))
    within_bound(rollouts, steps)
    state = json.loads((run / "checkpoints" / "a" / f"step-{KILL_STEPS}" / "trainer_state.json").read_text())
    assert state["version"] == KILL_STEPS
    con = open_store(run)
    assert con.execute("SELECT count(*), count(DISTINCT session_id) FROM sessions WHERE status = 'ok'").fetchone() == (
        2 * KILL_STEPS, 2 * KILL_STEPS)


def test_what_cannot_overlap_is_refused_at_the_spec_line(tiny_model, tmp_path):
    path = spec(tmp_path, tiny_model)
    path.write_text(path.read_text() + "buffer seen { capacity = 4; fields = {x: number} }\n")
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(path), "--out", str(tmp_path / "runs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "'max_staleness = 1' (asynchronous rollouts) cannot run with a buffer" in proc.stderr, proc.stderr
    assert "t.ask:7:" in proc.stderr and "Traceback" not in proc.stderr
