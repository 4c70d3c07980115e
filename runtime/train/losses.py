"""Policy losses per token, the KL penalty, and how token losses become the batch loss.

Rows are completions: row b holds one turn's completion tokens (mask 1) of trajectory
`traj[b]`; a multi-turn trajectory spans several rows. `logp` are the current policy's
log-probs of the sampled tokens, `old_logp` the ones recorded at sampling time, `adv` one
advantage per row (its trajectory's). With r_t = exp(logp − old_logp):

    ppo     −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A); with dual_clip c, a negative-advantage
            token loses at most c·|A| (OpenRLHF's dual clip)
    gspo    as ppo with the trajectory's length-normalised sequence ratio
            s = exp(mean_t(logp − old_logp)) in place of r (GSPO; gradient flows through s)
    cispo   −sg(clip(r, 1 − ε_low, 1 + ε_high))·A·logp: the weight is detached, so a clipped
            token still passes gradient through log π (MiniMax-M1)
    sft     −logp

A stale rollout (sampled by weights μ older than the trained weights π_old, `max_staleness`
> 0) is corrected per token by the truncated importance weight w = min(exp(log π_old −
log μ), is_bound), which multiplies its policy loss, whose ratio r is then taken against
π_old instead of μ (decoupled PPO; OpenRLHF's token-level TIS). On-policy tokens have
w = 1 and r against μ, as without staleness.

KL to a frozen reference (per token, added to the loss times `kl`): k1 = logp − ref,
k3 = exp(ref − logp) − (ref − logp) − 1.

Aggregation gives every row one weight so that the batch loss is Σ_b w_b Σ_t loss·mask:
    token     w = 1 / (trained tokens in the batch)
    sequence  w = 1 / (trajectories × tokens of the row's trajectory)
    constant  w = 1 / (trajectories × max_tokens)            (Dr. GRPO)
The weights come from the whole batch, so micro-batches summed under gradient
accumulation give exactly the full batch's loss and gradient.
"""

from __future__ import annotations

import torch

from askspec.ir.vocab import AGGREGATIONS, LOSSES


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, traj: torch.Tensor,
                       n_traj: int | None = None) -> torch.Tensor:
    """Per row: mean over its trajectory's tokens (all its rows) of logp − old_logp."""
    n = int(traj.max()) + 1 if n_traj is None else n_traj
    diff = ((logp - old_logp) * mask).sum(-1)
    total = torch.zeros(n, dtype=diff.dtype, device=diff.device).index_add(0, traj, diff)
    count = torch.zeros(n, dtype=mask.dtype, device=mask.device).index_add(0, traj, mask.sum(-1))
    return (total / count.clamp(min=1))[traj]


def policy_token_loss(kind: str, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                      traj: torch.Tensor | None = None, *, clip_low: float = 0.2, clip_high: float = 0.2,
                      dual_clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss [B, T] and a bool [B, T] marking tokens whose ratio was clipped."""
    a = adv.to(logp.dtype)[:, None]
    if kind == "sft":
        return -logp, torch.zeros_like(mask, dtype=torch.bool)
    if kind == "cispo":
        ratio = (logp - old_logp).clamp(-20.0, 20.0).exp()
        weight = ratio.clamp(1 - clip_low, 1 + clip_high).detach()
        return -weight * a * logp, (ratio < 1 - clip_low) | (ratio > 1 + clip_high)
    if kind == "ppo":
        ratio = (logp - old_logp).clamp(-20.0, 20.0).exp()
    elif kind == "gspo":
        if traj is None:
            traj = torch.arange(logp.shape[0], device=logp.device)
        ratio = sequence_log_ratio(logp, old_logp, mask, traj).exp()[:, None].expand_as(logp)
    else:
        raise ValueError(f"unknown policy loss {kind!r}; one of {', '.join(LOSSES)}")
    surr1 = ratio * a
    surr2 = ratio.clamp(1 - clip_low, 1 + clip_high) * a
    clipped = torch.min(surr1, surr2)
    if dual_clip is not None:
        clipped = torch.where(a < 0, torch.max(clipped, dual_clip * a), clipped)
    return -clipped, surr2 < surr1


def importance_weights(train_logp: torch.Tensor, sample_logp: torch.Tensor, bound: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, ratio) per token: ratio = π_old/μ = exp(train_logp − sample_logp) and its
    truncation w = min(ratio, bound); both detached (the weight scales the gradient, it
    is not differentiated). Padding (0 in both) gets ratio 1."""
    ratio = (train_logp - sample_logp).detach().clamp(-20.0, 20.0).exp()
    return ratio.clamp(max=bound), ratio


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from the sampled tokens' log-probs."""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        d = ref_logp - logp
        return d.exp() - d - 1
    raise ValueError(f"unknown KL estimator {estimator!r}; k1 or k3")


def row_weights(aggregation: str, row_tokens: torch.Tensor, traj: torch.Tensor, max_tokens: int | None = None) -> torch.Tensor:
    """One weight per row (see the module docstring). `row_tokens[b]` = trained tokens of row b."""
    rt = row_tokens.double()
    n_traj = int(torch.unique(traj).numel())
    if aggregation == "token":
        return (torch.ones_like(rt) / rt.sum().clamp(min=1)).float()
    if aggregation == "sequence":
        per_traj = torch.zeros(int(traj.max()) + 1, dtype=torch.float64).index_add(0, traj, rt)
        return (1.0 / (n_traj * per_traj[traj].clamp(min=1))).float()
    if aggregation == "constant":
        if not max_tokens:
            raise ValueError("constant aggregation needs max_tokens")
        return torch.full_like(rt, 1.0 / (n_traj * max_tokens)).float()
    raise ValueError(f"unknown aggregation {aggregation!r}; one of {', '.join(AGGREGATIONS)}")


def aggregate(token_loss: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_b weights[b] Σ_t token_loss·mask."""
    return ((token_loss * mask).sum(-1) * weights.to(token_loss.dtype)).sum()
