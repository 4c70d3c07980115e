"""Advantage estimators on a batch's tensors: one scalar reward per trajectory in, one
advantage out.

Trajectories come in groups (rollouts of the same game element); `groups[i]` is the
group index of trajectory i. Groups may have different sizes. The estimators, their
definitions and the group std (sample by default, population with `std = "population"`)
are askspec.ir.advantages's, the one reference the TUI and the OpenRLHF target use too;
this module applies its formulas (`RAW`, `std_divisor`) to every group of a batch at once.

The two whitened estimators follow OpenRLHF 0.11.2, which normalises them over all action
tokens of the batch; `token_counts` gives each trajectory's number of trained tokens so
the mean and variance are token-weighted exactly as there.
"""

from __future__ import annotations

import torch

from askspec.ir.advantages import NO_BASELINE, RAW, WHITENED, check_std, std_divisor
from askspec.ir.vocab import ESTIMATORS


def _group_stats(rewards: torch.Tensor, groups: torch.Tensor,
                 std_kind: str = "sample") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per trajectory: its group's size, mean and std (0 for size 1): the sample std
    (divided by n − 1) or the population std (by n)."""
    n_groups = int(groups.max()) + 1 if groups.numel() else 0
    r = rewards.double()
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, torch.ones_like(r))
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, r)
    mean = (total / count.clamp(min=1))[groups]
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, (r - mean) ** 2)
    n = count[groups]
    std = torch.where(n > 1, (sq[groups] / std_divisor(n, std_kind).clamp(min=1)).sqrt(), torch.zeros_like(r))
    return n, mean, std


def advantages(estimator: str, rewards: torch.Tensor, groups: torch.Tensor,
               token_counts: torch.Tensor | None = None, std: str = "sample") -> torch.Tensor:
    """Advantages [N] (float32) for trajectory rewards [N] in groups [N] (long, 0..G-1);
    `std` is the train block's (sample | population), read by grpo and group_norm."""
    if estimator not in RAW:
        raise ValueError(f"unknown advantage estimator {estimator!r}; one of {', '.join(ESTIMATORS)}")
    check_std(std)
    r = rewards.double()
    if r.numel() == 0:
        return r.float()
    n, mean, sd = _group_stats(r, groups, std)
    alone = n < 2
    # a lone trajectory's value is computed as in a pair (rloo divides by n − 1), then
    # replaced by 0 below
    adv = RAW[estimator](r, n.clamp(min=2), mean, sd)
    if estimator not in NO_BASELINE:
        adv = torch.where(alone, torch.zeros_like(adv), adv)
    if estimator in WHITENED:
        adv = whiten(adv, token_counts)
    return adv.float()


def whiten(adv: torch.Tensor, token_counts: torch.Tensor | None) -> torch.Tensor:
    """(a − mean) / sqrt(max(var, 1e-8)), mean and variance weighted by tokens (OpenRLHF)."""
    w = torch.ones_like(adv) if token_counts is None else token_counts.to(adv.dtype)
    total = w.sum()
    if total <= 0:
        return adv
    mean = (adv * w).sum() / total
    var = ((adv - mean) ** 2 * w).sum() / total
    return (adv - mean) * var.clamp(min=1e-8).rsqrt()


def zero_variance_groups(rewards: torch.Tensor, groups: torch.Tensor) -> int:
    """Groups of two or more whose rewards are all equal (they teach a group-relative
    estimator nothing)."""
    if rewards.numel() == 0:
        return 0
    n, _, std = _group_stats(rewards, groups)
    seen: set[int] = set()
    for g, size, s in zip(groups.tolist(), n.tolist(), std.tolist()):
        if size > 1 and s == 0.0:
            seen.add(g)
    return len(seen)
