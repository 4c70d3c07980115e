"""Advantage estimators: one scalar reward per trajectory in, one advantage out.

Trajectories come in groups (rollouts of the same game element); `groups[i]` is the
group index of trajectory i. Groups may have different sizes. Every estimator leaves a
trajectory alone in its group (size 1) with advantage 0, except `reinforce`, which has no
baseline. Definitions (r_i the reward, G the group, n = |G|):

    grpo                (r_i − mean_G) / (std_G + 1e-4)      (TRL)
    group_norm          (r_i − mean_G) / (std_G + 1e-9)      (OpenRLHF)
    dr_grpo             r_i − mean_G                          (no std division)
    rloo                r_i − mean_{j≠i} r_j                  (sums to zero per group)
    reinforce_baseline  r_i − mean_G, then whitened over the batch (OpenRLHF)
    reinforce           r_i, whitened over the batch (OpenRLHF)

std_G is the sample std (Bessel's n − 1, as TRL and OpenRLHF) unless `std = "population"`
(n, Reasoning Arena's Eq. 2): at n = 8 the sample std is √(8/7) ≈ 1.07 times the
population one, so population advantages are that much larger.

The two whitened estimators follow OpenRLHF 0.11.2, which normalises them over all action
tokens of the batch; `token_counts` gives each trajectory's number of trained tokens so
the mean and variance are token-weighted exactly as there.
"""

from __future__ import annotations

from typing import Callable

import torch

from askspec.ir.vocab import ADVANTAGE_STDS, ESTIMATORS

Raw = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# estimator -> its advantage from (reward, group size, group mean, group std) per trajectory
_RAW: dict[str, Raw] = {
    "grpo": lambda r, n, mean, std: (r - mean) / (std + 1e-4),
    "group_norm": lambda r, n, mean, std: (r - mean) / (std + 1e-9),
    "dr_grpo": lambda r, n, mean, std: r - mean,
    "rloo": lambda r, n, mean, std: r - (mean * n - r) / (n - 1).clamp(min=1),
    "reinforce_baseline": lambda r, n, mean, std: r - mean,
    "reinforce": lambda r, n, mean, std: r.clone(),
}


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
    dof = n - 1 if std_kind == "sample" else n
    std = torch.where(n > 1, (sq[groups] / dof.clamp(min=1)).sqrt(), torch.zeros_like(r))
    return n, mean, std


def advantages(estimator: str, rewards: torch.Tensor, groups: torch.Tensor,
               token_counts: torch.Tensor | None = None, std: str = "sample") -> torch.Tensor:
    """Advantages [N] (float32) for trajectory rewards [N] in groups [N] (long, 0..G-1);
    `std` is the train block's (sample | population), read by grpo and group_norm."""
    if estimator not in _RAW:
        raise ValueError(f"unknown advantage estimator {estimator!r}; one of {', '.join(ESTIMATORS)}")
    if std not in ADVANTAGE_STDS:
        raise ValueError(f"unknown advantage std {std!r}; one of {', '.join(ADVANTAGE_STDS)}")
    r = rewards.double()
    if r.numel() == 0:
        return r.float()
    n, mean, sd = _group_stats(r, groups, std)
    alone = n < 2
    adv = _RAW[estimator](r, n, mean, sd)
    if estimator != "reinforce":
        adv = torch.where(alone, torch.zeros_like(adv), adv)
    if estimator in ("reinforce", "reinforce_baseline"):
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
