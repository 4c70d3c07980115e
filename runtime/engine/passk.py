"""The evaluation metrics of an `evaluate` stage, from its recorded sessions: pass@k (the
unbiased estimator of Chen et al. 2021) and avg@n per game and weights (docs/training.md,
"Stages"). Read by `askspec metrics`; the trainer only plays the sessions."""

from __future__ import annotations

from math import comb
from typing import Any

from askspec.ir import model as ir


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are right (Chen et al.
    2021): 1 − C(n − c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def is_right(score: Any) -> bool:
    """A sample counts for pass@k when its score is true or reaches 1."""
    return score is True or (isinstance(score, (int, float)) and not isinstance(score, bool) and score >= 1)


def evaluation_rows(stage: ir.Stage, sessions: list[tuple[str, Any, Any, Any]]) -> list[dict[str, Any]]:
    """pass@k (each k) and avg@n per (game, weights) of an evaluate stage, from its sessions
    as (game, weights, item key, score); items are averaged with equal weight. avg@n is
    the mean score over the n samples (for 0/1 scores: the accuracy); a session without a
    score (an error) is left out of its item's n."""
    items: dict[tuple[str, Any, Any], list[Any]] = {}
    for game, weights, item, score in sessions:
        items.setdefault((game, weights, item), []).append(score)
    rows = []
    for game in stage.options["games"]:
        for weights in stage.options["weights"]:
            mine = [v for (g, w, _), v in sorted(items.items(), key=lambda kv: str(kv[0])) if g == game and w == weights]
            mine = [[s for s in scores if s is not None] for scores in mine]
            mine = [s for s in mine if s]
            by = {"game": game, "weights": weights}
            for k in stage.options["k"]:
                usable = [s for s in mine if len(s) >= k]
                value = sum(pass_at_k(len(s), sum(is_right(x) for x in s), k) for s in usable) / len(usable) if usable else None
                rows.append({"metric": f"pass@{k}", "by": by, "value": value, "n": len(usable)})
            n = stage.options["samples"]
            value = sum(sum(float(x) for x in s) / len(s) for s in mine) / len(mine) if mine else None
            rows.append({"metric": f"avg@{n}", "by": by, "value": value, "n": len(mine)})
    return rows
