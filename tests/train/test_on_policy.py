"""The sampler plays exactly the weights being trained (issue 30): on-policy, the trainer's
log-probabilities of the sampled tokens equal the sampler's, so the importance ratio is 1,
nothing is clipped and `train_steps.mismatch_kl` is float noise, under every combination
the runtime offers (fused AdamW or not, oneDNN or torch linear layers, prefix reuse on or
off, several epochs, a resumed run); and a tiny model learns a reward it must raise.

These are invariant tests: they fail when any cache of model state outlives an update. A
sampler decoding from prompt keys/values computed under older weights (the regression the
issue measured: torch's fused AdamW writes parameters without bumping their version
counters) gives a KL of 3e-6 (lr 0.003) to 1e-2 (lr 0.03) here, against ~1e-13 on-policy.

On the suite's tiny random Llama (tests/conftest.py), sampling with top_k = 2: each position
chooses between two tokens, so a reward on the reply's length in characters is learnable in
a few steps (the sampler's log-probabilities are of the whole distribution, as the
trainer's: top_k is a sampling-time filter, see hf_ops.token_logprobs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from askspec.cli import main
from askspec.runtime.backends.hf import HFBackend
from askspec.runtime.store.views import open_store
from askspec.runtime.train.policy import TrainedPolicy

pytestmark = pytest.mark.slow  # (askspec processes, a Ray cluster or a real model)

ON_POLICY_KL = 1e-9  # float noise is ~1e-13; a stale cache gave 3e-6 (lr 0.003) to 1e-2 (lr 0.03)
ON_POLICY_ABS = 1e-5  # float noise ~1e-7; a stale cache gave 1.5e-3 and more

# two asks with memory = full: the second prompt extends the first (prefix reuse within a
# session), and every step's prompts share the chat template's opening (across steps)
TWO_TURNS = """model m = hf("{model}") {{ max_tokens = 5; temperature = 1.0; top_k = 2{options} }}
role a {{ model = m; memory = full; prompt = "Write one long word, please, as long as you can make it."; trained }}
game g for i in range(0, 4) {{
    x = ask a
    y = ask a: "Another one, longer still, please."
    reward a = (len(x.text) + len(y.text)) / 50
}}
train a with grpo {{ group = 4; batch = 8; steps = {steps}; save_every = {save_every}; lr = {lr}{hyper} }}
"""

LEARN = """model m = hf("{model}") {{ max_tokens = 6; temperature = 1.0; top_k = 2 }}
role a {{ model = m; memory = none; prompt = "Write one long word, please, as long as you can make it."; trained }}
game g for i in range(0, 8) {{
    x = ask a
    reward a = len(x.text) / 40
}}
train a with grpo {{ group = 8; batch = 16; steps = 16; save_every = 100; lr = 0.03 }}
"""


def write_spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.ask"
    path.write_text(text, encoding="utf-8")
    return path


def run_in_process(spec: Path, out: Path, *args: str) -> tuple[int, Path]:
    rc = main(["run", str(spec), "--out", str(out), "--quiet", "--seed", "0", *args])
    runs = [p for p in out.iterdir() if not p.name.startswith(".")]
    assert len(runs) == 1, runs
    return rc, runs[0]


def train_steps(run: Path) -> list[dict]:
    """The run's train_steps view (the columns a user queries)."""
    con = open_store(run)
    try:
        rows = con.execute("SELECT step, skipped, clip_frac, mismatch_abs, mismatch_kl, reward_mean, "
                           "metrics::VARCHAR FROM train_steps ORDER BY step").fetchall()
    finally:
        con.close()
    cols = ("step", "skipped", "clip_frac", "mismatch_abs", "mismatch_kl", "reward_mean", "metrics")
    return [dict(zip(cols, r)) for r in rows]


def assert_on_policy(steps: list[dict], epochs: int = 1) -> None:
    updated = [s for s in steps if s["skipped"] is None]
    assert len(updated) >= 2, steps  # a later step runs on weights the sampler must have picked up
    for s in updated:
        assert s["mismatch_kl"] is not None and 0.0 <= s["mismatch_kl"] < ON_POLICY_KL, s
        assert s["mismatch_abs"] < ON_POLICY_ABS, s
        if epochs == 1:  # the ratio is 1 in the first epoch: nothing to clip
            assert s["clip_frac"] == 0.0, s


def non_fused_adamw(self, params):
    cfg = self.cfg
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay,
                             foreach=False, fused=False)


COMBINATIONS = {
    # (fused AdamW, oneDNN linear layers, prefix reuse, epochs): each setting both ways
    "fused-onednn-prefix": (True, True, True, 1),
    "loop-torch-prefix-2epochs": (False, False, True, 2),
    "fused-torch-noprefix-2epochs": (True, False, False, 2),
    "loop-onednn-noprefix": (False, True, False, 1),
}


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_on_policy_steps_have_ratio_one_under_every_combination(name, tiny_model, tmp_path, monkeypatch):
    fused, onednn, prefix, epochs = COMBINATIONS[name]
    if not fused:
        monkeypatch.setattr(TrainedPolicy, "_adamw", non_fused_adamw)
    if not onednn:
        monkeypatch.setenv("ASKSPEC_CPU_LINEAR", "torch")
    spec = write_spec(tmp_path, TWO_TURNS.format(model=tiny_model, steps=4, save_every=100,
                                                 options="" if prefix else "; prefix_cache = false",
                                                 hyper=f"; epochs = {epochs}" if epochs > 1 else "", lr=0.003))
    rc, run = run_in_process(spec, tmp_path / "runs")
    assert rc == 0
    assert_on_policy(train_steps(run), epochs)


def test_a_sampler_that_misses_an_update_is_caught(tiny_model, tmp_path, monkeypatch):
    """The regression itself: a backend not told of the optimizer's writes keeps decoding
    from prompt keys/values of older weights. The mismatch sees it; each such step says so
    (`mismatch_warning`), and with on_mismatch = error the run stops once it is recorded."""
    monkeypatch.setattr(HFBackend, "weights_changed", lambda self: None)
    spec = write_spec(tmp_path, TWO_TURNS.format(model=tiny_model, steps=4, save_every=100, options="", hyper="",
                                                 lr=0.003))
    rc, run = run_in_process(spec, tmp_path / "runs")
    assert rc == 0
    steps = train_steps(run)
    later = [s for s in steps[1:] if s["skipped"] is None]
    # the invariant the other tests assert fails, and the default bound (1e-6 in float32) sees it
    assert later and max(s["mismatch_kl"] for s in later) > 1e-6 and max(s["mismatch_abs"] for s in later) > 1e-4
    assert any("mismatch_warning" in json.loads(s["metrics"]) for s in later)

    strict = write_spec(tmp_path, TWO_TURNS.format(model=tiny_model, steps=4, save_every=100, options="",
                                                   hyper="; on_mismatch = error", lr=0.003))
    rc, run = run_in_process(strict, tmp_path / "strict")
    assert rc != 0
    recorded = train_steps(run)
    assert len(recorded) < 4 and recorded[-1]["mismatch_kl"] > 1e-6  # stopped at the first such step


def test_every_write_of_the_served_weights_advances_the_backends_version(tiny_model):
    from askspec.ir import model as ir
    from askspec.lang.training import lower_training
    from askspec.runtime.train.batch import Trajectory, Turn
    from askspec.runtime.train.config import config_from_ir

    exp = lower_training(ir.Experiment(name="t", roles=[ir.Role(name="r", trained=True)],
                                       training=[ir.Training(role="r", algorithm="grpo")]), {"r": {"lr": 0.01}})
    policy = TrainedPolicy(config_from_ir(exp.training[0], exp), str(tiny_model), {"num_threads": 1})
    backend = policy.backend
    v0 = backend.weights_version
    done = [10, 11, 2]
    batch = [Trajectory(f"s{i}/r", "g0", float(i), [Turn(f"s{i}", 1, 0, [1, 5, 8, 9], done, [-3.0] * 3, 1.0, "stop")])
             for i in range(2)]
    policy.update(batch)
    assert backend.weights_version > v0  # the optimizer's in-place writes
    v1 = backend.weights_version
    policy.take_weights(policy.state())
    assert backend.weights_version > v1  # load_state_dict
    v2 = backend.weights_version
    policy.update([Trajectory("s/r", "g0", 1.0, batch[0].turns), Trajectory("t/r", "g0", 1.0, batch[1].turns)])
    assert backend.weights_version == v2  # a skipped step (equal rewards) writes no weight


def test_a_tiny_model_learns_a_reward_it_must_raise(tiny_model, tmp_path):
    """16 GRPO steps: the reward (the reply's length in characters) rises, every updated step
    on-policy. On a sampler that missed the updates (the regression), the same run's steps
    ran off-policy with clip 2-16 % and the issue's spec stopped learning."""
    rc, run = run_in_process(write_spec(tmp_path, LEARN.format(model=tiny_model)), tmp_path / "runs")
    assert rc == 0
    steps = train_steps(run)
    assert len(steps) == 16
    first, last = [s["reward_mean"] for s in steps[:3]], [s["reward_mean"] for s in steps[-4:]]
    assert sum(last) / len(last) > sum(first) / len(first) + 0.2, [s["reward_mean"] for s in steps]
    assert_on_policy(steps)


def test_a_resumed_run_samples_the_weights_it_trains(tiny_model, tmp_path, e2e):
    """kill -9 after a checkpoint, then --resume: the resumed process loads the checkpoint
    into the trained module and its sampler; its steps are on-policy too."""
    spec = write_spec(tmp_path, TWO_TURNS.format(model=tiny_model, steps=6, save_every=2, options="", hyper="",
                                                 lr=0.003))
    out = tmp_path / "runs"
    e2e.kill_run_when(e2e.cmd("run", str(spec), "--out", str(out), "--quiet", "--seed", "0"), out,
                      lambda o: (lambda s: s if s is not None and s >= 2 else None)(e2e.latest_step(o)), timeout=300)
    run = e2e.only_run(out)
    e2e.resume(run)
    steps = train_steps(run)
    assert [s["step"] for s in steps][-1] == 6
    assert_on_policy([s for s in steps if s["step"] > 2])
