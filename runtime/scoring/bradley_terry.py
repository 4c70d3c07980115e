"""Bradley-Terry fitting and win-rate aggregation for trace tournaments.

Reasoning Arena (papers/reasoning_arena.txt, §4 "Bradley-Terry Reward Aggregation",
Eqs. 8-10): every observed match (i, j, o_ij) is mirrored as (j, i, 1 - o_ij); the
strengths beta minimise the L2-regularised soft cross-entropy

    L(beta) = - sum_{(i,j,o) in M~} [ o log s(b_i - b_j) + (1 - o) log s(b_j - b_i) ]
              + 1/2 ||beta||^2

with L-BFGS-B, and are then min-max normalised to [0, 1]. A match is a tuple
``(i, j, o)`` with ``o`` the soft outcome for ``i`` (1 = i won, 0 = j won, 1/2 = tie).

Because ``-[o log s(d) + (1-o) log s(-d)] = softplus(d) - o*d`` (d = b_i - b_j), the loss
and its gradient are computed in that numerically stable form.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from askspec.runtime.scoring._blas import single_threaded_blas

Comparison = tuple[int, int, float]  # (i, j, o_ij)

# Spreads below this are treated as "all equal" by minmax_normalise: the BT fit is
# accurate to ~1e-9 (see fit_bradley_terry), so smaller differences are optimiser noise
# and must not be blown up into a 0-vs-1 reward gap.
EQUAL_ATOL = 1e-8


def _as_arrays(n: int, matches: Iterable[Sequence[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = [tuple(m) for m in matches]
    if not rows:
        return np.zeros(0, np.intp), np.zeros(0, np.intp), np.zeros(0, np.float64)
    if any(len(r) != 3 for r in rows):
        raise ValueError("each match must be a (i, j, outcome) triple")
    i = np.array([r[0] for r in rows])
    j = np.array([r[1] for r in rows])
    o = np.array([r[2] for r in rows], dtype=np.float64)
    for name, idx in (("i", i), ("j", j)):
        if not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"match index {name} must be an integer")
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"match index {name} out of range for n={n}")
    if np.any(i == j):
        raise ValueError("a trace cannot be matched against itself")
    if not np.all(np.isfinite(o)) or np.any(o < 0.0) or np.any(o > 1.0):
        raise ValueError("match outcomes must be finite and in [0, 1]")
    return i.astype(np.intp), j.astype(np.intp), o


def mirror(matches: Iterable[Sequence[float]]) -> list[Comparison]:
    """Return the symmetrised match set: every (i, j, o) plus its mirror (j, i, 1 - o).

    Order debiasing, reasoning_arena.txt §4: mirroring enforces o_ij + o_ji = 1 even
    when a position-biased judge would violate it.
    """
    rows = [(int(i), int(j), float(o)) for i, j, o in matches]
    return rows + [(j, i, 1.0 - o) for i, j, o in rows]


def bt_loss_and_grad(beta: np.ndarray, i: np.ndarray, j: np.ndarray, o: np.ndarray,
                     l2: float = 1.0) -> tuple[float, np.ndarray]:
    """Objective (Eq. 10, with ``l2`` scaling the 1/2||beta||^2 term) and its gradient."""
    d = beta[i] - beta[j]
    loss = float(np.sum(np.logaddexp(0.0, d) - o * d)) + 0.5 * l2 * float(beta @ beta)
    from scipy.special import expit  # scipy only where a fit runs: every askspec process imports this module

    r = expit(d) - o  # d loss / d d for each match
    n = beta.shape[0]
    # float64 (weighted counts); numpy's stubs type bincount as integer whatever its weights
    grad: np.ndarray = np.bincount(i, weights=r, minlength=n) - np.bincount(j, weights=r, minlength=n)
    grad += l2 * beta
    return loss, grad


def fit_bradley_terry(n: int, matches: Iterable[Sequence[float]], l2: float = 1.0) -> np.ndarray:
    """Fit BT log-strengths for ``n`` traces by minimising Eq. 10 with L-BFGS-B.

    ``matches`` is used as given: pass ``mirror(observed)`` to reproduce the paper (the
    tournament driver does). ``l2`` multiplies the paper's 1/2||beta||^2 (paper: 1.0) and
    must be > 0; it makes the objective ``l2``-strongly convex, so the optimum is unique
    and finite on any graph — disconnected, perfectly separated or empty (then beta = 0).
    Strong convexity also bounds the error: ||beta - beta*|| <= ||grad L(beta)|| / l2, and
    the tolerances below drive ||grad|| to ~1e-10.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if not l2 > 0.0 or not np.isfinite(l2):
        raise ValueError("l2 must be a finite number > 0 (the regulariser makes the fit well-posed)")
    i, j, o = _as_arrays(n, matches)
    if n == 0 or i.size == 0:
        return np.zeros(n)
    with single_threaded_blas():  # see _blas.py: tiny BLAS calls, thread hand-offs dominate
        res = _minimize(i, j, o, n, l2)
    beta = np.asarray(res.x, dtype=np.float64)
    if not np.all(np.isfinite(beta)):  # cannot happen for l2 > 0; guard against NaN input paths
        raise FloatingPointError("Bradley-Terry fit produced non-finite strengths")
    return beta


def _minimize(i: np.ndarray, j: np.ndarray, o: np.ndarray, n: int, l2: float):
    from scipy.optimize import minimize  # (~0.5 s to import: only when a tournament is fitted)

    return minimize(
        bt_loss_and_grad,
        np.zeros(n),
        args=(i, j, o, l2),
        jac=True,
        method="L-BFGS-B",
        # ftol=0 leaves the projected-gradient test as the stopping rule; a line-search
        # stop near the optimum is harmless (the gradient is already ~1e-9 there).
        options={"gtol": 1e-10, "ftol": 0.0, "maxiter": 10_000, "maxcor": 20},
    )


def win_rates(n: int, matches: Iterable[Sequence[float]]) -> np.ndarray:
    """Per-trace mean outcome over the matches listing it first (Eq. 8).

    With a mirrored complete round robin this is exactly R_wr(y_i) = 1/(N-1) sum_j o_ij.
    The denominator is the number of matches actually played, so skipped (unparseable)
    matches are excluded rather than counted as losses. A trace with no matches gets 1/2,
    the tie value (no evidence either way).
    """
    i, _, o = _as_arrays(n, matches)
    total = np.bincount(i, weights=o, minlength=n).astype(np.float64)
    count = np.bincount(i, minlength=n)
    out = np.full(n, 0.5)
    played = count > 0
    out[played] = total[played] / count[played]
    return out


def minmax_normalise(x: Sequence[float] | np.ndarray, atol: float = EQUAL_ATOL) -> np.ndarray:
    """Min-max normalise to [0, 1] (reasoning_arena.txt §4, last sentence of BT paragraph).

    The paper does not define the all-equal case; here every value maps to 1/2 (the tie
    value) when max - min <= ``atol``. Any constant gives zero group advantage, and 1/2 keeps
    a no-information group in the middle of the reward range for logging.
    """
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return a.copy()
    if not np.all(np.isfinite(a)):
        raise ValueError("cannot normalise non-finite values")
    lo, hi = float(a.min()), float(a.max())
    if hi - lo <= atol:
        return np.full(a.shape, 0.5)
    return np.clip((a - lo) / (hi - lo), 0.0, 1.0)
