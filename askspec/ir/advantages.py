"""The advantage estimators (askspec.ir.vocab.ESTIMATORS) and the group std they divide
by, defined once, in plain Python: the trainer (askspec.runtime.train.advantages) applies
these formulas to a batch's tensors (and the OpenRLHF target's advantages hook calls the
trainer's function), the TUI's Groups tab to one group's rewards, and the trainer's
`train_steps.reward_std` and the hook's logged group std take their std from here; tests
hold each against this module.

One scalar reward per trajectory; trajectories come in groups (rollouts of the same game
element). r_i the reward, G the group, n = |G|:

    grpo                (r_i − mean_G) / (std_G + 1e-4)      (TRL)
    group_norm          (r_i − mean_G) / (std_G + 1e-9)      (OpenRLHF)
    dr_grpo             r_i − mean_G                          (no std division)
    rloo                r_i − mean_{j≠i} r_j                  (sums to zero per group)
    reinforce_baseline  r_i − mean_G, then whitened over the batch (OpenRLHF)
    reinforce           r_i, whitened over the batch (OpenRLHF)

A trajectory alone in its group (n = 1) gets 0, except with `reinforce` (no baseline).
std_G is the sample std (Bessel's n − 1, as TRL and OpenRLHF) unless the train block says
`std = "population"` (n, Reasoning Arena's Eq. 2). The batch whitening of the two
reinforce estimators is the trainer's (it needs every trajectory of the batch and its
token count); `group_advantages` gives their values before it.

The formulas only add, subtract, multiply and divide, so `RAW` applies as well to floats
as to tensors (the trainer's); `std_divisor` likewise."""

from __future__ import annotations

import math
from typing import Any, Callable

from .vocab import ADVANTAGE_STDS, ESTIMATORS

# ε added to the std by the estimators that divide by it (vocab.STD_ESTIMATORS)
STD_EPS: dict[str, float] = {"grpo": 1e-4, "group_norm": 1e-9}

# estimator -> its advantage from (reward, group size, group mean, group std), for a group
# of two or more (rloo divides by n − 1): floats or tensors alike
RAW: dict[str, Callable[[Any, Any, Any, Any], Any]] = {
    "grpo": lambda r, n, mean, std: (r - mean) / (std + STD_EPS["grpo"]),
    "group_norm": lambda r, n, mean, std: (r - mean) / (std + STD_EPS["group_norm"]),
    "dr_grpo": lambda r, n, mean, std: r - mean,
    "rloo": lambda r, n, mean, std: r - (mean * n - r) / (n - 1),
    "reinforce_baseline": lambda r, n, mean, std: r - mean,
    "reinforce": lambda r, n, mean, std: r,
}
WHITENED = ("reinforce", "reinforce_baseline")  # normalised over the whole batch after RAW
NO_BASELINE = ("reinforce",)  # the estimator that leaves a lone trajectory its reward

# the formulas as the TUI's Groups tab states them, per group: r the member's reward
TEXT: dict[str, str] = {
    "grpo": "(r − mean) / (std + 1e-4)",
    "group_norm": "(r − mean) / (std + 1e-9)",
    "dr_grpo": "r − mean",
    "rloo": "r − mean of the others",
    "reinforce_baseline": "r − mean (then whitened over the batch: not shown)",
    "reinforce": "r (whitened over the batch: not shown)",
}

assert set(RAW) == set(ESTIMATORS) == set(TEXT)


def check_std(kind: str) -> None:
    if kind not in ADVANTAGE_STDS:
        raise ValueError(f"unknown advantage std {kind!r}; one of {', '.join(ADVANTAGE_STDS)}")


def std_divisor(n: Any, kind: str = "sample") -> Any:
    """What a group's summed squared deviations are divided by: n − 1 (`sample`, Bessel's
    correction) or n (`population`); n an int or a tensor of group sizes."""
    check_std(kind)
    return n - 1 if kind == "sample" else n


def group_std(values: list[float], kind: str = "sample") -> float:
    """The std of a group's rewards (0 for fewer than two), `sample` or `population` as
    the train block's `std` says."""
    n = len(values)
    check_std(kind)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / std_divisor(n, kind))


def population_over_sample(n: int) -> float:
    """A group of n's sample std over its population std, √(n / (n − 1)) (1 for n < 2):
    what OpenRLHF's group_norm (sample std) is multiplied by to divide by the population
    std instead."""
    return math.sqrt(n / (n - 1)) if n > 1 else 1.0


def group_advantages(estimator: str, rewards: list[float | None], std: str = "sample") -> list[float | None]:
    """Each member's advantage in its group (None for a member without a reward, which
    the trainer leaves out); before the batch whitening for the reinforce estimators."""
    if estimator not in RAW:
        raise ValueError(f"unknown advantage estimator {estimator!r}; one of {', '.join(ESTIMATORS)}")
    got = [r for r in rewards if r is not None]
    n = len(got)
    mean = sum(got) / n if n else 0.0
    sd = group_std(got, std)
    raw = RAW[estimator]
    return [None if r is None else raw(r, n, mean, sd) if n > 1 or estimator in NO_BASELINE else 0.0
            for r in rewards]
