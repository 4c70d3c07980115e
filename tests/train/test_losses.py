"""Policy losses on a tiny model whose logits are its parameters, so every gradient is
hand-computable: d(log softmax(θ)[k]) / dθ = onehot(k) − softmax(θ)."""

from __future__ import annotations

import math

import pytest
import torch

from askspec.runtime.train.losses import aggregate, kl_penalty, policy_token_loss, row_weights, sequence_log_ratio


class TinyPolicy(torch.nn.Module):
    """logits[b, t] = θ[b, t]: a 'model' with one free logit vector per position."""

    def __init__(self, rows: int, steps: int, vocab: int = 3, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.theta = torch.nn.Parameter(torch.randn(rows, steps, vocab, generator=gen, dtype=torch.float64))

    def logp(self, tokens: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        theta = self.theta if rows is None else self.theta[rows]
        return theta.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)


def grad_of_logp(model: TinyPolicy, tokens: torch.Tensor) -> torch.Tensor:
    """d logp[b, t] / d θ[b, t, :] (hand formula)."""
    onehot = torch.nn.functional.one_hot(tokens, model.theta.shape[-1]).double()
    return onehot - model.theta.detach().softmax(-1)


TOKENS = torch.tensor([[0, 2, 1], [1, 1, 0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)


def test_masked_tokens_get_exactly_zero_gradient():
    for kind in ("ppo", "gspo", "cispo", "sft"):
        m = TinyPolicy(2, 3)
        logp = m.logp(TOKENS)
        old = logp.detach() + 0.3
        token_loss, _ = policy_token_loss(kind, logp, old, torch.tensor([1.0, -2.0]), MASK, torch.tensor([0, 1]))
        w = row_weights("token", MASK.sum(-1), torch.tensor([0, 1]))
        aggregate(token_loss, MASK, w).backward()
        assert torch.count_nonzero(m.theta.grad[0, 2]) == 0, kind  # the masked position
        assert torch.count_nonzero(m.theta.grad[0, :2]) > 0, kind


def test_ppo_hand_values_and_clip():
    logp = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.25, 0.25]], dtype=torch.float64))  # ratios 2.0 and 1.0
    loss, clipped = policy_token_loss("ppo", logp, old, torch.tensor([1.0]), torch.ones(1, 2), clip_low=0.2, clip_high=0.2)
    assert loss[0].tolist() == pytest.approx([-1.2, -1.0])  # min(2*1, 1.2*1) = 1.2
    assert clipped.tolist() == [[True, False]]
    loss, _ = policy_token_loss("ppo", logp, old, torch.tensor([-1.0]), torch.ones(1, 2), clip_low=0.2, clip_high=0.2)
    assert loss[0].tolist() == pytest.approx([2.0, 1.0])  # min(-2, -1.2) = -2 -> loss 2
    loss, _ = policy_token_loss("ppo", logp, old, torch.tensor([-1.0]), torch.ones(1, 2), clip_low=0.2, clip_high=0.2,
                                dual_clip=1.5)
    assert loss[0].tolist() == pytest.approx([1.5, 1.0])  # dual clip: at most 1.5 * |A|


def test_cispo_passes_gradient_through_clipped_tokens_with_the_clipped_detached_weight():
    m = TinyPolicy(1, 2, seed=3)
    tokens = torch.tensor([[2, 0]])
    logp = m.logp(tokens)
    # ratio of token 0 is e^2 ≈ 7.39 (clipped to 1 + 3 = 4), token 1 is e^-2 (clipped up to 1 - 0.75 = 0.25)
    old = logp.detach() + torch.tensor([[-2.0, 2.0]], dtype=torch.float64)
    adv = torch.tensor([0.7])
    loss, clipped = policy_token_loss("cispo", logp, old, adv, torch.ones(1, 2), clip_low=0.75, clip_high=3.0)
    assert clipped.tolist() == [[True, True]]
    lp = logp.detach()
    assert loss.detach()[0].tolist() == pytest.approx([-4.0 * 0.7 * float(lp[0, 0]), -0.25 * 0.7 * float(lp[0, 1])])
    loss.sum().backward()
    g = grad_of_logp(m, tokens)
    want = torch.stack([-4.0 * 0.7 * g[0, 0], -0.25 * 0.7 * g[0, 1]])
    assert torch.allclose(m.theta.grad[0], want, atol=1e-12)
    assert torch.count_nonzero(m.theta.grad) > 0  # PPO would give zero gradient here (clipped, A > 0)


def test_gspo_uses_the_length_normalised_sequence_ratio():
    m = TinyPolicy(2, 3, seed=1)
    logp = m.logp(TOKENS)
    delta = torch.tensor([[0.1, -0.3, 5.0], [0.2, 0.2, -0.1]], dtype=torch.float64)
    old = logp.detach() - delta
    traj = torch.tensor([0, 1])
    s = sequence_log_ratio(logp, old, MASK, traj)
    # row 0: mean over its 2 unmasked tokens (the masked 5.0 is ignored); row 1: over 3
    assert s.detach().tolist() == pytest.approx([(0.1 - 0.3) / 2, (0.2 + 0.2 - 0.1) / 3])
    adv = torch.tensor([1.0, 1.0])
    loss, _ = policy_token_loss("gspo", logp, old, adv, MASK, traj, clip_low=1.0, clip_high=1.0)
    ratio = s.detach().exp()
    assert loss[0, :2].detach().tolist() == pytest.approx([-float(ratio[0])] * 2)
    # gradient: d(-exp(s)) / dθ = -exp(s) * (1/|y|) Σ_t d logp_t / dθ
    w = row_weights("sequence", MASK.sum(-1), traj)
    aggregate(loss, MASK, w).backward()
    g = grad_of_logp(m, TOKENS)
    want0 = -float(ratio[0]) / 2 * g[0, :2] / 2  # weight 1/(2 trajectories), seq loss = -ratio
    assert torch.allclose(m.theta.grad[0, :2], want0, atol=1e-12)


def test_gspo_ratio_spans_every_row_of_a_multi_turn_trajectory():
    logp = torch.zeros(2, 2, dtype=torch.float64)
    old = torch.tensor([[-1.0, -1.0], [-3.0, 0.0]], dtype=torch.float64)
    s = sequence_log_ratio(logp, old, torch.ones(2, 2, dtype=torch.float64), torch.tensor([0, 0]))
    assert s.tolist() == pytest.approx([5 / 4, 5 / 4])


def test_kl_estimators():
    logp = torch.log(torch.tensor([0.5]))
    ref = torch.log(torch.tensor([0.25]))
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - math.log(0.5) - 1)
    assert kl_penalty(ref, ref, "k3").item() == 0.0


def test_aggregations_hand_values():
    loss = torch.tensor([[1.0, 2.0, 9.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    traj = torch.tensor([0, 1])
    tokens = mask.sum(-1)
    assert aggregate(loss, mask, row_weights("token", tokens, traj)).item() == pytest.approx(12 / 5)
    assert aggregate(loss, mask, row_weights("sequence", tokens, traj)).item() == pytest.approx((1.5 + 3.0) / 2)
    assert aggregate(loss, mask, row_weights("constant", tokens, traj, max_tokens=4)).item() == pytest.approx(12 / 8)
    # two rows of one trajectory count as one sequence
    assert aggregate(loss, mask, row_weights("sequence", tokens, torch.tensor([0, 0]))).item() == pytest.approx(12 / 5)


def test_micro_batches_sum_to_the_full_batch_gradient():
    m = TinyPolicy(4, 3, seed=7)
    tokens = torch.tensor([[0, 1, 2], [2, 2, 0], [1, 0, 0], [0, 0, 1]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    traj = torch.tensor([0, 0, 1, 2])
    adv = torch.tensor([1.0, 1.0, -0.5, 2.0])
    w = row_weights("sequence", mask.sum(-1), traj)
    logp = m.logp(tokens)
    full, _ = policy_token_loss("ppo", logp, logp.detach() - 0.1, adv, mask, traj)
    aggregate(full, mask, w).backward()
    full_grad = m.theta.grad.clone()
    m.theta.grad = None
    for rows in ([0, 1], [2, 3]):
        lp = m.logp(tokens[rows], rows)
        part, _ = policy_token_loss("ppo", lp, lp.detach() - 0.1, adv[rows], mask[rows], traj[rows])
        aggregate(part, mask[rows], w[rows]).backward()
    assert torch.allclose(m.theta.grad, full_grad, atol=1e-12)
