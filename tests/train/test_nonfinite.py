"""A NaN or infinite advantage, loss or gradient never reaches the weights (issue #25,
item 4): the update is not applied, the step writes no checkpoint, its train_steps row
says why, and after `max_nonfinite_steps` such steps the run stops with exit 1. On the
suite's tiny random Llama (tests/conftest.py), never SmolLM2's weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from askspec.ir import model as ir
from askspec.lang.training import lower_training
from askspec.runtime.train.batch import Trajectory, Turn
from askspec.runtime.train.config import config_from_ir

ROOT = Path(__file__).resolve().parents[2]


def policy_for(folder: Path, **hyper):
    from askspec.runtime.train.policy import TrainedPolicy

    exp = lower_training(ir.Experiment(name="t", roles=[ir.Role(name="r", trained=True)],
                                       training=[ir.Training(role="r", algorithm="grpo")]), {"r": {"lr": 0.01, **hyper}})
    return TrainedPolicy(config_from_ir(exp.training[0], exp), str(folder), {"num_threads": 1})


def trajectories(rewards: list[float], old_logprob: float = -3.0) -> list[Trajectory]:
    return [Trajectory(f"s{i}/r", "g0", r, [Turn(f"s{i}", 1, 0, [1, 5, 8, 9], [10, 11, 2], [old_logprob] * 3, 1.0, "stop")])
            for i, r in enumerate(rewards)]


def test_a_nonfinite_loss_or_advantage_is_not_applied(tiny_model):
    policy = policy_for(tiny_model, epochs=2)
    before = [p.detach().clone() for p in policy.params]
    # a sampler log-prob that is not a number makes the ratio, and the loss, not a number
    m = policy.update(trajectories([0.0, 1.0], old_logprob=float("nan")))
    assert m["nonfinite"] in ("loss", "gradient") and m["loss"] is None and m["skipped"] == "nonfinite"
    assert m["skip_reason"].startswith("not applied")
    assert all(torch.equal(a, p) for a, p in zip(before, policy.params))
    assert not policy.optimizer.state  # AdamW's moments untouched as well
    # rewards of 1e308 overflow the group's mean: the advantage is infinite
    m = policy.update(trajectories([1e308, 1e308]))
    assert m["nonfinite"] == "advantage" and m["loss"] is None
    assert all(torch.equal(a, p) for a, p in zip(before, policy.params)) and policy.finite()
    # a finite batch still trains
    m = policy.update(trajectories([0.0, 1.0]))
    assert "nonfinite" not in m and m["loss"] is not None
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.params))
    with torch.no_grad():
        policy.params[0][0, 0] = float("inf")
    assert not policy.finite()


SPEC = """model m = hf("{model}") {{ max_tokens = 3; temperature = 1.0 }}
role a {{ model = m; memory = none; prompt = "a + b"; trained }}
game g for i in range(0, 8) {{
    x = ask a
    reward a = case {{ i < 2 -> len(x.text); else -> 1e308 }}
}}
train a with grpo {{ group = 2; steps = 6; max_nonfinite_steps = 2; save_every = 1; lr = 0.01 }}
"""


def test_the_run_stops_after_max_nonfinite_steps_without_their_checkpoints(tiny_model, tmp_path):
    spec = tmp_path / "nan.ask"
    spec.write_text(SPEC.format(model=tiny_model))
    env = {k: v for k, v in os.environ.items() if k != "ASKSPEC_DEBUG"}
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(spec), "--out", str(tmp_path / "runs")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "2 training step(s) had a NaN or infinite advantage (steps 3, 4; max_nonfinite_steps = 2)" in proc.stderr
    assert "the newest is step 2" in proc.stderr and "Traceback" not in proc.stderr
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir() and not d.name.startswith(".")]
    steps = [json.loads(line) for line in (run_dir / "events" / "train_steps.ndjson").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert [s["metrics"].get("nonfinite") for s in steps] == [None, None, "advantage", "advantage"]
    assert steps[2]["loss"] is None and steps[2]["skipped"] == "nonfinite"
    assert steps[2]["metrics"]["skip_reason"].startswith("not applied")
    ckpt = run_dir / "checkpoints"
    assert json.loads((ckpt / "latest.json").read_text())["step"] == 2
    assert sorted(p.name for p in (ckpt / "a").iterdir()) == ["step-1", "step-2"]
    raw = (run_dir / "events" / "train_steps.ndjson").read_text() + (run_dir / "events" / "rewards.ndjson").read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"
