"""Bradley-Terry fit (reasoning_arena.txt §4, Eq. 10) against an independent implementation."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy.optimize import minimize

from askspec.runtime.scoring.bradley_terry import (
    bt_loss_and_grad,
    fit_bradley_terry,
    minmax_normalise,
    mirror,
    win_rates,
)


def reference_loss(beta, matches, l2=1.0):
    """Eq. 10 written term by term, independently of the module's softplus form."""
    total = 0.0
    for i, j, o in matches:
        d = beta[i] - beta[j]
        # log s(x) = -log(1 + e^-x), evaluated stably on either sign of x
        log_p_ij = -math.log1p(math.exp(-d)) if d >= 0 else d - math.log1p(math.exp(d))
        log_p_ji = -math.log1p(math.exp(d)) if d <= 0 else -d - math.log1p(math.exp(-d))
        total -= o * log_p_ij + (1.0 - o) * log_p_ji
    return total + 0.5 * l2 * sum(b * b for b in beta)


def reference_fit(n, matches, l2=1.0):
    """BFGS with finite-difference gradients (no analytic gradient anywhere)."""
    if n == 0:
        return np.zeros(0)
    res = minimize(lambda b: reference_loss(b, matches, l2), np.zeros(n), method="BFGS",
                   options={"gtol": 1e-10, "maxiter": 10_000})
    return res.x


def numerical_grad(f, x, h=1e-6):
    g = np.zeros_like(x)
    for k in range(x.size):
        e = np.zeros_like(x)
        e[k] = h
        g[k] = (f(x + e) - f(x - e)) / (2 * h)
    return g


SOFT = (1.0, 0.5, 0.0, 0.8, 0.2)


def random_graph(rng: random.Random, n: int, m: int, outcomes=SOFT):
    out = []
    for _ in range(m):
        i, j = rng.sample(range(n), 2)
        out.append((i, j, rng.choice(outcomes)))
    return out


def two_components(rng: random.Random):
    a = random_graph(rng, 4, 8)
    b = [(i + 4, j + 4, o) for i, j, o in random_graph(rng, 4, 8)]
    return a + b


_rng = random.Random(20240601)
CASES = [
    ("empty_graph", 6, []),
    ("single_trace_no_matches", 1, []),
    ("single_match", 2, [(0, 1, 1.0)]),
    ("tie_only", 3, [(0, 1, 0.5), (1, 2, 0.5)]),
    ("perfect_separation_chain", 5, [(k, k + 1, 1.0) for k in range(4)]),
    ("complete_round_robin_soft", 8, [(i, j, _rng.choice(SOFT)) for i in range(8) for j in range(i + 1, 8)]),
    ("sparse_random", 10, random_graph(_rng, 10, 12)),
    ("dense_multi_edges", 5, random_graph(_rng, 5, 60)),
    ("disconnected_two_components", 8, two_components(_rng)),
    ("isolated_nodes", 7, [(0, 1, 1.0), (1, 0, 0.8), (2, 3, 0.2)]),
    ("live_like_18", 8, [(k, o, _rng.choice(SOFT)) for k in range(1, 8)
                         for o in sorted({0, k - 1, (k - 1) // 2})]),
]


@pytest.mark.parametrize("name,n,observed", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("l2", [1.0, 0.3])
def test_fit_matches_independent_implementation(name, n, observed, l2):
    matches = mirror(observed)
    ours = fit_bradley_terry(n, matches, l2=l2)
    ref = reference_fit(n, matches, l2=l2)
    assert ours.shape == (n,)
    np.testing.assert_allclose(ours, ref, atol=1e-6, rtol=0)
    # Optimality certificate: the objective is l2-strongly convex, so
    # ||beta - beta*|| <= ||grad L(beta)|| / l2; check it with a numerical gradient.
    if n:
        g = numerical_grad(lambda b: reference_loss(b, matches, l2), ours)
        assert np.linalg.norm(g) / l2 < 1e-6


def test_empty_graph_gives_zero_strengths_and_half_scores():
    beta = fit_bradley_terry(5, [])
    assert np.array_equal(beta, np.zeros(5))
    assert np.array_equal(minmax_normalise(beta), np.full(5, 0.5))
    assert fit_bradley_terry(0, []).shape == (0,)


def test_analytic_gradient_matches_numerical():
    rng = random.Random(3)
    matches = mirror(random_graph(rng, 6, 20))
    i = np.array([m[0] for m in matches])
    j = np.array([m[1] for m in matches])
    o = np.array([m[2] for m in matches])
    beta = np.array([rng.uniform(-2, 2) for _ in range(6)])
    _, g = bt_loss_and_grad(beta, i, j, o, 1.0)
    np.testing.assert_allclose(g, numerical_grad(lambda b: reference_loss(b, matches), beta), atol=1e-6)
    loss, _ = bt_loss_and_grad(beta, i, j, o, 1.0)
    assert loss == pytest.approx(reference_loss(beta, matches), rel=1e-12)


def test_strengths_sum_to_zero_and_order_follows_wins():
    # At the optimum sum_i dL/dbeta_i = l2 * sum(beta) = 0 (each match adds +r and -r).
    beta = fit_bradley_terry(4, mirror([(0, 1, 1.0), (1, 2, 1.0), (2, 3, 1.0), (0, 3, 1.0)]))
    assert abs(beta.sum()) < 1e-9
    assert beta[0] > beta[1] > beta[2] > beta[3]


def test_disconnected_components_are_each_centred():
    # The regulariser anchors each component: with no cross-component evidence the
    # optimum decouples and each component's strengths sum to zero on their own.
    rng = random.Random(11)
    observed = two_components(rng)
    beta = fit_bradley_terry(8, mirror(observed))
    assert abs(beta[:4].sum()) < 1e-8 and abs(beta[4:].sum()) < 1e-8


@pytest.mark.parametrize("bad", [
    [(0, 0, 1.0)],            # self-match
    [(0, 5, 1.0)],            # index out of range
    [(0, 1, 1.5)],            # outcome outside [0, 1]
    [(0, 1, float("nan"))],
    [(0.0, 1, 1.0)],          # non-integer index
    [(0, 1)],                 # not a triple
])
def test_invalid_matches_raise(bad):
    with pytest.raises(ValueError):
        fit_bradley_terry(3, bad)


def test_l2_must_be_positive():
    with pytest.raises(ValueError):
        fit_bradley_terry(2, [(0, 1, 1.0)], l2=0.0)


# ----------------------------------------------------------------- mirroring / order

def _flip(m):
    i, j, o = m
    return (j, i, 1.0 - o)


@pytest.mark.parametrize("seed", range(5))
def test_mirrored_result_is_independent_of_presentation(seed):
    """Permuting matches and flipping any subset's orientation ((i,j,o) -> (j,i,1-o):
    the same judgement recorded from the other side) leaves the mirrored match set, and
    so both aggregates, unchanged."""
    rng = random.Random(seed)
    observed = random_graph(rng, 8, 18)
    shuffled = [(_flip(m) if rng.random() < 0.5 else m) for m in observed]
    rng.shuffle(shuffled)
    a, b = mirror(observed), mirror(shuffled)
    def canon(ms):  # 1 - (1 - o) need not equal o bit for bit
        return sorted((i, j, round(o, 12)) for i, j, o in ms)

    assert canon(a) == canon(b)
    np.testing.assert_allclose(fit_bradley_terry(8, a), fit_bradley_terry(8, b), atol=1e-9)
    np.testing.assert_allclose(win_rates(8, a), win_rates(8, b), atol=1e-12)


def test_win_rates_without_mirroring_depend_on_orientation():
    # Why the driver mirrors: unmirrored, a win rate only counts matches listed first.
    observed = [(0, 1, 1.0)]
    assert list(win_rates(2, observed)) == [1.0, 0.5]
    assert list(win_rates(2, [_flip(observed[0])])) == [0.5, 0.0]
    flipped = [_flip(observed[0])]
    assert list(win_rates(2, mirror(observed))) == list(win_rates(2, mirror(flipped))) == [1.0, 0.0]


def test_mirror_adds_complements():
    assert mirror([(0, 1, 0.8)]) == [(0, 1, 0.8), (1, 0, pytest.approx(0.2))]
    assert mirror([]) == []


# ----------------------------------------------------------------- win rate / minmax

def test_win_rate_is_eq8_on_complete_round_robin():
    n = 4
    observed = [(0, 1, 1.0), (0, 2, 0.5), (0, 3, 0.0), (1, 2, 1.0), (1, 3, 1.0), (2, 3, 0.5)]
    wr = win_rates(n, mirror(observed))
    # R_wr(y_i) = 1/(N-1) sum_{j != i} o_ij
    expected = [(1 + 0.5 + 0) / 3, (0 + 1 + 1) / 3, (0.5 + 0 + 0.5) / 3, (1 + 0 + 0.5) / 3]
    np.testing.assert_allclose(wr, expected)


def test_win_rate_of_trace_without_matches_is_half():
    assert list(win_rates(3, mirror([(0, 1, 1.0)]))) == [1.0, 0.0, 0.5]


@pytest.mark.parametrize("x,expected", [
    ([1.0, 2.0, 3.0], [0.0, 0.5, 1.0]),
    ([-1.0, 1.0], [0.0, 1.0]),
    ([0.3, 0.3, 0.3], [0.5, 0.5, 0.5]),          # all equal: the tie value
    ([0.1 + 1e-12, 0.1], [0.5, 0.5]),             # below the fit's accuracy: equal
    ([], []),
])
def test_minmax_normalise(x, expected):
    np.testing.assert_allclose(minmax_normalise(x), expected)
