"""hf sampling and KV-cache pieces on small hand-made tensors (no model needed)."""

from __future__ import annotations

import torch

from askspec.runtime.backends.hf_ops import CANDIDATES, GrowingLayer, RowSampling, draw, sample_rows


def _gens(*seeds: int) -> list[torch.Generator]:
    out = []
    for s in seeds:
        g = torch.Generator()
        g.manual_seed(s)
        out.append(g)
    return out


def _draws(logits: torch.Tensor, params: RowSampling, n: int = 200, seed: int = 0) -> list[int]:
    gen = _gens(seed)
    return [sample_rows(logits[None], [params], gen)[0] for _ in range(n)]


def test_greedy_is_argmax_and_uses_no_randomness():
    logits = torch.tensor([[0.1, 3.0, 2.0], [5.0, 1.0, 0.0]])
    gens = _gens(1, 2)
    before = [g.get_state() for g in gens]
    assert sample_rows(logits, [RowSampling(temperature=0.0)] * 2, gens) == [1, 0]
    assert all(torch.equal(b, g.get_state()) for b, g in zip(before, gens))


def test_filters_that_leave_one_token_give_argmax():
    logits = torch.randn(1000)
    best = int(logits.argmax())
    for params in (RowSampling(top_k=1), RowSampling(top_p=1e-6), RowSampling(min_p=1.0)):
        assert set(_draws(logits, params, n=20)) == {best}


def test_top_k_keeps_the_k_best():
    logits = torch.tensor([4.0, 3.9, 3.8, 0.0, -1.0, 3.7])
    picks = set(_draws(logits, RowSampling(top_k=3)))
    assert picks == {0, 1, 2}


def test_top_p_cut_is_exact():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    picks = set(_draws(probs.log(), RowSampling(top_p=0.5)))
    assert picks == {0, 1}  # 0.4 alone is short of 0.5; 0.4 + 0.3 reaches it
    picks = set(_draws(probs.log(), RowSampling(top_p=0.75)))
    assert picks == {0, 1, 2}


def test_top_p_beyond_the_candidates_falls_back_to_a_full_sort():
    vocab = 5000
    logits = -torch.arange(vocab, dtype=torch.float32) * 1e-4  # nearly flat, best first
    picks = _draws(logits, RowSampling(top_p=0.9), n=300)
    assert max(picks) > CANDIDATES  # the tail beyond the first candidates is reachable
    assert max(picks) < 4700  # ... but the last ~10% of the mass is not


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    picks = set(_draws(probs.log(), RowSampling(min_p=0.25)))
    assert picks == {0, 1, 2}  # 0.05 < 0.25 * 0.5


def test_repetition_penalty_lowers_seen_tokens_either_sign():
    greedy = RowSampling(temperature=0.0, repetition=2.0)
    seen = torch.tensor([True, False])
    assert sample_rows(torch.tensor([[2.0, 1.5]]), [greedy], _gens(0), seen_all=[seen]) == [1]
    assert sample_rows(torch.tensor([[-1.0, -1.5]]), [greedy], _gens(0), seen_all=[seen]) == [1]
    assert sample_rows(torch.tensor([[2.0, 1.5]]), [RowSampling(temperature=0.0)], _gens(0)) == [0]


def test_presence_penalty_subtracts_from_generated_tokens():
    row = RowSampling(temperature=0.0, presence=0.5)
    assert sample_rows(torch.tensor([[1.0, 0.8]]), [row], _gens(0), seen_gen=[torch.tensor([True, False])]) == [1]


def test_same_seed_same_stream_whatever_the_neighbours():
    torch.manual_seed(0)
    mine = torch.randn(300)
    params = RowSampling(temperature=0.9, top_p=0.9)
    alone_gen = _gens(42)
    alone = [sample_rows(mine[None], [params], alone_gen)[0] for _ in range(30)]
    mixed_gens = _gens(7, 42, 9)
    mixed = []
    for _ in range(30):
        logits = torch.stack([torch.randn(300), mine, torch.randn(300)])
        rows = [RowSampling(temperature=1.0), params, RowSampling(temperature=0.0)]
        mixed.append(sample_rows(logits, rows, mixed_gens)[1])
    assert alone == mixed


def test_draw_never_picks_zero_probability_tokens():
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 0.5]])
    gens = _gens(1, 2)
    for _ in range(100):
        a, b = draw(probs, gens).tolist()
        assert a == 2 and b in (1, 3)


def test_growing_layer_matches_concatenation():
    layer = GrowingLayer()
    k0, v0 = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    layer.update(k0, v0)
    ks, vs = [k0], [v0]
    for _ in range(150):  # past the spare room: the buffer has to grow
        k, v = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
        keys, values = layer.update(k, v)
        ks.append(k)
        vs.append(v)
    assert torch.equal(keys, torch.cat(ks, dim=2)) and torch.equal(values, torch.cat(vs, dim=2))
    assert layer.get_seq_length() == 155
    layer.batch_select_indices(torch.tensor([1]))
    assert torch.equal(layer.keys, torch.cat(ks, dim=2)[1:])
    keys, _ = layer.update(torch.ones(1, 3, 1, 4), torch.ones(1, 3, 1, 4))
    assert keys.shape == (1, 3, 156, 4) and torch.equal(keys[:, :, -1], torch.ones(1, 3, 4))
