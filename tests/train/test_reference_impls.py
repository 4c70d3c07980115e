"""Our advantages and losses against TRL 1.16's and OpenRLHF 0.11.2's own code on the same
tensors, to 1e-6 (values and gradients). Each test skips, saying why, when the package is
missing (`scripts/setup.sh` installs both: TRL through the dev extra, OpenRLHF with
--no-deps because its wheel's dependencies need a GPU toolchain)."""

from __future__ import annotations


import pytest
import torch

import reference_impls as ref

from askspec.runtime.train.advantages import advantages
from askspec.runtime.train.losses import aggregate, kl_penalty, policy_token_loss, row_weights

needs_trl = pytest.mark.skipif(ref.trl_nanstd() is None, reason="trl==1.16.0 is not installed (pip install -e '.[dev]')")
needs_openrlhf = pytest.mark.skipif(ref.openrlhf_root() is None,
                                    reason="openrlhf==0.11.2 is not installed (pip install --no-deps openrlhf==0.11.2)")

B, T = 6, 5


def batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    old = logp.detach() + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.4
    ref_logp = logp.detach() + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    return logp, old, ref_logp, adv, mask


def ours(kind, aggregation, logp, old, adv, mask, *, clip_low, clip_high, kl=0.0, ref_logp=None, max_tokens=None,
         dual_clip=None):
    traj = torch.arange(logp.shape[0])
    token_loss, _ = policy_token_loss(kind, logp, old, adv, mask, traj, clip_low=clip_low, clip_high=clip_high,
                                      dual_clip=dual_clip)
    if kl:
        token_loss = token_loss + kl * kl_penalty(logp, ref_logp, "k3")
    return aggregate(token_loss, mask, row_weights(aggregation, mask.sum(-1), traj, max_tokens))


def same(a: torch.Tensor, b: torch.Tensor, logp: torch.Tensor) -> None:
    assert float(a.detach()) == pytest.approx(float(b.detach()), abs=1e-6)
    ga, = torch.autograd.grad(a, logp, retain_graph=True)
    gb, = torch.autograd.grad(b, logp, retain_graph=True)
    assert torch.allclose(ga, gb, atol=1e-6)


@needs_trl
@pytest.mark.parametrize("trl_type, kind, aggregation", [("grpo", "ppo", "sequence"), ("bnpo", "ppo", "token"),
                                                         ("dr_grpo", "ppo", "constant")])
def test_trl_clipped_losses(trl_type, kind, aggregation):
    logp, old, ref_logp, adv, mask = batch(1)
    theirs = ref.trl_compute_loss(trl_type, logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28, beta=0.04,
                                  ref_logps=ref_logp, max_completion_length=T)
    mine = ours(kind, aggregation, logp, old, adv, mask, clip_low=0.2, clip_high=0.28, kl=0.04, ref_logp=ref_logp,
                max_tokens=T)
    same(mine, theirs, logp)


@needs_trl
def test_trl_cispo():
    # TRL caps the detached ratio at epsilon_high with no lower clip: ours with ε_low = 1 and 1 + ε_high = cap
    logp, old, _, adv, mask = batch(2)
    theirs = ref.trl_compute_loss("cispo", logp, old, adv, mask, epsilon_high=1.3)
    mine = ours("cispo", "token", logp, old, adv, mask, clip_low=1.0, clip_high=0.3)
    same(mine, theirs, logp)


@needs_trl
def test_trl_gspo_sequence_level_importance_sampling():
    # TRL's GSPO = loss_type "grpo" with importance_sampling_level="sequence"
    logp, old, _, adv, mask = batch(3)
    theirs = ref.trl_compute_loss("grpo", logp, old, adv, mask, epsilon_low=3e-4, epsilon_high=4e-4,
                                  importance_sampling_level="sequence")
    mine = ours("gspo", "sequence", logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4)
    same(mine, theirs, logp)


@needs_trl
def test_trl_grpo_advantages():
    nanstd = ref.trl_nanstd()
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 0.0, 1.0, 1.0])
    g = 4
    grouped = rewards.view(-1, g)
    # the lines of GRPOTrainer._generate_and_score_completions (scale_rewards="group")
    mean = grouped.mean(dim=1).repeat_interleave(g)
    std = nanstd(grouped, dim=1).repeat_interleave(g)
    theirs = (rewards - mean) / (std + 1e-4)
    mine = advantages("grpo", rewards, torch.arange(8) // g)
    assert torch.allclose(mine, theirs, atol=1e-6)


@needs_openrlhf
@pytest.mark.parametrize("kind, aggregation, dual", [("ppo", "token", None), ("ppo", "sequence", None),
                                                     ("ppo", "token", 3.0), ("gspo", "sequence", None)])
def test_openrlhf_policy_loss(kind, aggregation, dual):
    loss_mod = ref.openrlhf_loss()
    logp, old, _, adv, mask = batch(4)
    policy = loss_mod.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.3, dual_clip=dual,
                                 token_level_loss=aggregation == "token", policy_loss_type=kind)
    theirs, clip_ratio, *_ = policy(logp, old, adv[:, None].expand(B, T), action_mask=mask)
    mine = ours(kind, aggregation, logp, old, adv, mask, clip_low=0.2, clip_high=0.3, dual_clip=dual)
    same(mine, theirs, logp)


@needs_openrlhf
def test_openrlhf_sft_loss():
    loss_mod = ref.openrlhf_loss()
    logp, old, _, adv, mask = batch(5)
    theirs = loss_mod.SFTLoss(token_level_loss=True)(logp, mask)
    mine = ours("sft", "token", logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    same(mine, theirs, logp)


@needs_openrlhf
@pytest.mark.parametrize("estimator", ["rloo", "reinforce_baseline", "group_norm", "dr_grpo", "reinforce"])
def test_openrlhf_advantages(estimator):
    rewards = [1.0, 0.0, 0.5, 0.25, 2.0, 0.0, 1.0, -1.0, 0.3, 0.3, 0.3, 0.3]
    n = 4
    lengths = torch.tensor([3, 5, 1, 2, 4, 4, 5, 1, 2, 3, 3, 5])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    theirs = ref.openrlhf_advantages(estimator, rewards, n, mask)
    mine = advantages(estimator, torch.tensor(rewards), torch.arange(12) // n, token_counts=lengths)
    # theirs is per token; on each trajectory's action tokens it is constant and equals ours
    for i in range(12):
        row = theirs[i][mask[i] > 0]
        assert torch.allclose(row, torch.full_like(row, float(mine[i])), atol=1e-6), (estimator, i)
