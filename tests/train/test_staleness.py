"""Asynchronous rollouts (`max_staleness`, issue #26 item 3): a rollout sampled by older
weights is trained with the truncated importance weight w = min(π_old/μ, is_bound) on its
policy loss; a rollout of the trained weights' own version has w = 1 and trains exactly
as without staleness; a rollout staler than the bound is never trained on. On the suite's
tiny random Llama (tests/conftest.py `tiny_model`)."""

from __future__ import annotations

import math

import pytest
import torch

from askspec.runtime.train.losses import importance_weights

from test_policy import policy_for, trajectories

pytestmark = pytest.mark.slow  # builds a tiny model with SmolLM2's tokenizer (the converted GGUF)


def test_importance_weights_are_truncated_ratios():
    train = torch.tensor([[-1.0, -2.0, 0.0]])
    sample = torch.tensor([[-1.0, -3.0, 0.0]])
    w, ratio = importance_weights(train, sample, 2.0)
    assert ratio[0].tolist() == pytest.approx([1.0, math.e, 1.0])
    assert w[0].tolist() == pytest.approx([1.0, 2.0, 1.0])  # e > 2: truncated


def own_logprobs(policy, trajs, shift: float = 0.0, version: int | None = None):
    """The trajectories with the policy's own log-probs (minus `shift`) as the sampled ones."""
    with torch.no_grad():
        for t in trajs:
            for turn in t.turns:
                logp, _ = policy.token_logprobs(policy.model, [turn])
                turn.logprobs = (logp[0, : len(turn.completion_ids)] - shift).tolist()
                turn.policy_version = version
    return trajs


def gradient(policy, trajs):
    seen = {}
    policy.optimizer.step = lambda *a: seen.__setitem__("g", [p.grad.clone() for p in policy.params])
    m = policy.update(trajs)
    return seen["g"], m


def test_equal_versions_train_exactly_as_on_policy(tiny_model):
    on = policy_for(tiny_model, "grpo")
    lagged = policy_for(tiny_model, "grpo", max_staleness=1)
    g0, m0 = gradient(on, trajectories())
    trajs = trajectories()
    for t in trajs:
        for turn in t.turns:
            turn.policy_version = 0  # the version the policy is at: not stale
    g1, m1 = gradient(lagged, trajs)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1)) and m0["loss"] == m1["loss"]
    assert (m1["is_ratio_mean"], m1["is_truncated_share"], m1["stale_share"]) == (1.0, 0.0, 0.0)
    assert "is_ratio_mean" not in m0  # max_staleness = 0 records nothing new


@pytest.mark.parametrize("bound, weight", [(2.0, 1.5), (1.2, 1.2)])
def test_a_stale_rollout_is_weighted_by_its_truncated_ratio(tiny_model, bound, weight):
    # sampled log-probs log(1.5) below the trained weights': every token's ratio is 1.5, so
    # the gradient is 1.5 (or the bound) times the on-policy one
    ref = policy_for(tiny_model, "grpo", grad_clip=0.0)  # the gradient itself, not its clipped norm
    g_ref, _ = gradient(ref, own_logprobs(ref, trajectories()))
    policy = policy_for(tiny_model, "grpo", max_staleness=1, is_bound=bound, grad_clip=0.0)
    policy.version = 1  # one update since the rollouts were sampled (weights unchanged: same π_old)
    g, m = gradient(policy, own_logprobs(policy, trajectories(), shift=math.log(1.5), version=0))
    for a, b in zip(g_ref, g):
        assert float((b - weight * a).norm()) <= 1e-4 * float((weight * a).norm())
    assert m["is_ratio_mean"] == pytest.approx(1.5, rel=1e-4) and m["stale_share"] == 1.0
    assert m["is_truncated_share"] == (1.0 if bound < 1.5 else 0.0)


def test_a_rollout_staler_than_the_bound_is_refused(tiny_model):
    policy = policy_for(tiny_model, "grpo", max_staleness=1)
    policy.version = 2
    trajs = trajectories()
    trajs[0].turns[0].policy_version = 0
    with pytest.raises(ValueError, match="policy version 0, outside \\[1, 2\\]"):
        policy.update(trajs)


def test_a_reset_serves_the_specs_weights(tiny_model):
    # a retrain stage resets its role, then plays it: the served copy must hold the fresh weights
    policy = policy_for(tiny_model, "grpo", max_staleness=1)
    with torch.no_grad():
        for p in policy.params:
            p.add_(1.0)
    policy.publish()
    policy.reset()
    served, trained = policy.served.state_dict(), policy.model.state_dict()
    assert policy.served is not policy.model and all(torch.equal(served[k], trained[k]) for k in trained)
    assert policy.sampling_version == policy.version
