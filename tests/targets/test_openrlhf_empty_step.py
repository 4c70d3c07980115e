"""A step with no loss token on OpenRLHF 0.11.2 (every rollout dropped, failed or
unrewarded: a SOAR step whose inner loop failed): OpenRLHF's own loss normalisation
(`iter_grad_accum_global_norm`'s token count, then `PolicyLoss` -> `aggregate_loss`)
makes it 0 / 0 = NaN; the job's askspec_ext/gate.py, hooked into OpenRLHF's own
`BasePPOTrainer.train_step` on CPU, skips it as the local trainer does (`train_steps.skipped
= 'no_tokens'`, no experience made, weights and AdamW state bit-identical), in a job with
no update gate, and trains the next step that has a token."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from askspec.cli import main
from askspec.runtime.store.views import open_store

from openrlhf_harness import launch_argv, load_policy_loss, parse_train_ppo_ray, train_flags
from openrlhf_modules import ppo_trainer, samples_generator
from test_openrlhf_gate import Maker, TinyActors, same, trainer

SPEC = """
model m = hf("smollm2-135m-instruct") { max_tokens = 32 }
role p { model = m; trained }
game g for x in [1, 2] sample 2 {
    a = ask p using "Say {{ x }}."
    reward p = len(a.text) / 10
}
train p with grpo { group = 2; batch = 4 }
"""


def samples(generator, job: Path, trained: list[bool]) -> list:
    """OpenRLHF's rollout samples (its own _process_response_into_experience) of agent
    responses: a trained rollout has its action range, a dropped one none and
    `askspec_trained_turns` 0, as the agent returns them (adapter.py)."""
    line = json.loads((job / "prompts.jsonl").read_text().splitlines()[0])
    out = []
    for k, ok in enumerate(trained):
        response = {"prompt": line["prompt"], "label": line["label"], "observation_tokens": [5, 6, 7, 8, 9, 10],
                    "action_ranges": [(3, 6)] if ok else [], "reward": 0.5 + k if ok else 0.0, "scores": 0.0,
                    "rollout_log_probs": None, "truncated": False,
                    "extra_logs": {"askspec_trained_turns": 1.0 if ok else 0.0}}
        out.append(generator.SamplesGenerator._process_response_into_experience(None, response, max_len=64))
    return out


def test_openrlhfs_own_loss_is_nan_on_a_step_without_tokens(tmp_path, monkeypatch) -> None:
    from openrlhf.utils.loss_utils import iter_grad_accum_global_norm

    loss = load_policy_loss(lambda name, module: monkeypatch.setitem(sys.modules, name, module))
    mask = torch.zeros(2, 3)
    ((_, info),) = list(iter_grad_accum_global_norm([mask], None, 1, lambda m: m))
    logp = torch.zeros(2, 3, requires_grad=True)
    total = loss.PolicyLoss()(logp, torch.zeros(2, 3), torch.zeros(2, 3), action_mask=mask, **info)[0]
    assert torch.isnan(total)  # what the hook keeps OpenRLHF from stepping on


def test_a_step_without_loss_tokens_is_skipped(tmp_path, monkeypatch, job_module) -> None:
    (tmp_path / "w.ask").write_text(SPEC)
    job = tmp_path / "job"
    assert main(["compile", str(tmp_path / "w.ask"), "--target", "openrlhf", "-o", str(job)]) == 0
    assert "update_gate" not in json.loads((job / "job.json").read_text())["extension"]
    register = lambda name, module: monkeypatch.setitem(sys.modules, name, module)  # noqa: E731
    module, generator = ppo_trainer(register), samples_generator(register)
    (call,) = launch_argv(job / "launch.sh", tmp_path)
    args = parse_train_ppo_ray(train_flags(call))
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "runs"))
    entry = job_module(job, "train_ppo_ray")
    assert entry.gate.used(entry.pinned.job_settings())  # every job with askspec's advantages hooks the step
    job_module(job, "gate").install(module)
    actors, maker = TinyActors(), Maker()
    t = trainer(module, args, actors, maker)
    status, step = t.train_step(samples(generator, job, [True, False, True, True]), 0)
    assert step == 1 and actors.fits == 1 and maker.calls == 1 and "askspec/skipped" not in status
    weights, optimizer = actors.snapshot()
    status, step = t.train_step(samples(generator, job, [False] * 4), 1)  # every member dropped
    assert step == 2 and status["askspec/skipped"] == 1.0 and "askspec/gate" not in status
    assert status["rollout/num_samples"] == 4.0  # OpenRLHF's own statistics of the batch
    assert actors.fits == 1 and maker.calls == 1 and actors.buffer == []
    assert same(actors.snapshot()[0], weights) and same(actors.optim.state_dict()["state"], optimizer["state"])
    # the learning-rate schedule counts the step, as the local trainer's (docs/training.md, "Skipped steps")
    assert actors.actor_scheduler.last_epoch == 2 and actors.optim.param_groups[0]["lr"] == pytest.approx(1e-2 / 3)
    status, step = t.train_step(samples(generator, job, [False, False, False, True]), 2)  # one token left: trains
    assert step == 3 and actors.fits == 2 and status["actor_lr"] == pytest.approx(1e-2 / 4)
    (run,) = [d for d in (tmp_path / "runs").iterdir() if (d / "manifest.json").exists()]
    rows = open_store(str(run)).execute(
        "SELECT step, skipped, metrics->>'skip_reason', metrics->>'tokens', lr FROM train_steps ORDER BY step"
    ).fetchall()
    assert rows == [(1, None, None, "9", pytest.approx(1e-2 / 2)),
                    (2, "no_tokens", "no trajectory with a trained token", "0", pytest.approx(1e-2 / 3)),
                    (3, None, None, "3", pytest.approx(1e-2 / 4))]
