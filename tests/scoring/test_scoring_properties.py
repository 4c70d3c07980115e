"""Hypothesis properties of the scoring layer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from askspec.runtime.scoring.bradley_terry import fit_bradley_terry, minmax_normalise, mirror, win_rates
from askspec.runtime.scoring.diversity import JaccardHistory, jaccard
from paper_rewards import group_norm, rloo

texts = st.text(alphabet=st.sampled_from("abc xyz 12+=?ÉéK\n"), max_size=40)


@given(texts, texts)
def test_jaccard_in_unit_interval_and_symmetric(a, b):
    j = jaccard(a, b)
    assert 0.0 <= j <= 1.0
    assert j == jaccard(b, a)
    assert jaccard(a, a) == 1.0


@given(st.lists(texts, max_size=30), texts)
def test_r_div_in_unit_interval(history, q):
    h = JaccardHistory(capacity=10)
    for t in history:
        h.add(t)
    assert 0.0 <= h.r_div(q) <= 1.0


@st.composite
def match_lists(draw):
    n = draw(st.integers(min_value=2, max_value=9))
    idx = st.integers(min_value=0, max_value=n - 1)
    pairs = draw(st.lists(st.tuples(idx, idx).filter(lambda p: p[0] != p[1]), max_size=40))
    outcomes = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.0, 1.0))
    return n, [(i, j, draw(outcomes)) for i, j in pairs]


@settings(max_examples=150, deadline=None)
@given(match_lists())
def test_bt_finite_on_any_match_list(case):
    n, matches = case
    beta = fit_bradley_terry(n, mirror(matches))
    assert beta.shape == (n,) and np.all(np.isfinite(beta))
    # optimality: sum_i dL/dbeta_i = l2 * sum(beta) = 0
    assert abs(beta.sum()) < 1e-6
    # with l2 = 1 every |beta_i| is bounded by its number of mirrored matches (grad = 0
    # gives beta_i = -sum (s(d) - o) over its matches, each term in [-1, 1])
    deg = np.bincount([i for i, _, _ in mirror(matches)], minlength=n)
    assert np.all(np.abs(beta) <= deg * 2 + 1e-6)
    scores = minmax_normalise(beta)
    assert np.all((scores >= 0) & (scores <= 1))


@settings(max_examples=60, deadline=None)
@given(match_lists())
def test_bt_flipping_every_outcome_negates_strengths(case):
    n, matches = case
    beta = fit_bradley_terry(n, mirror(matches))
    flipped = fit_bradley_terry(n, mirror([(i, j, 1.0 - o) for i, j, o in matches]))
    np.testing.assert_allclose(flipped, -beta, atol=1e-7)


@given(match_lists())
def test_win_rates_in_unit_interval(case):
    n, matches = case
    wr = win_rates(n, mirror(matches))
    assert np.all((wr >= 0) & (wr <= 1))


@given(st.lists(st.floats(-1e6, 1e6), max_size=16))
def test_rloo_sums_to_zero(rewards):
    adv = rloo(rewards)
    assert abs(adv.sum()) <= 1e-9 * max(1.0, np.abs(rewards).sum() if rewards else 1.0)


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=16))
def test_group_norm_is_zero_mean(rewards):
    adv = group_norm(rewards)
    assert np.all(np.isfinite(adv))
    assert abs(adv.mean()) < 1e-6


def test_blas_thread_limit_is_restored_after_scoring():
    """The scoring kernels run BLAS single-threaded (runtime/scoring/_blas.py) and must
    leave the process's thread settings as they found them."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from askspec.runtime.scoring.diversity import EmbeddingDiversity

    before = [info["num_threads"] for info in threadpoolctl.threadpool_info()]
    fit_bradley_terry(3, mirror([(0, 1, 1.0), (1, 2, 0.5)]))
    d = EmbeddingDiversity(embed=lambda texts: np.ones((len(texts), 4), dtype=np.float32))
    d.score_and_add("a")
    d.score_and_add("b")
    after = [info["num_threads"] for info in threadpoolctl.threadpool_info()]
    assert after == before
