"""Reference reward functions, table-driven from the papers' constants."""

from __future__ import annotations

from enum import Enum

import numpy as np
import pytest

from paper_rewards import (
    ask_e_calibration_reward,
    ask_e_outcome,
    ask_e_reward,
    askbench_terminal_reward,
    askbench_turn_reward,
    group_norm,
    learnability_dataset_reward,
    learnability_reward,
    median_index,
    pass_rate,
    pasodoble_proposer_reward,
    pasodoble_question_valid,
    pasodoble_solver_reward,
    pasodoble_solver_trains,
    rloo,
    soar_dataset_reward,
    soar_should_promote,
    soar_student_reward,
)

# ----------------------------------------------------------------- PasoDoble §3.3
# tau_low = 0.2, tau_div = 0.3, w = 0.2 (App. B Table 5); J = 6 so p in k/6.

P_VALUES = [0.0, 1 / 6, 0.2, 2 / 6, 0.5, 5 / 6, 1.0]
RDIV_VALUES = [0.0, 0.29, 0.3, 0.75, 1.0]


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("r_div", RDIV_VALUES)
def test_pasodoble_proposer_reward_table(p, r_div):
    got = pasodoble_proposer_reward(p, r_div)
    if p <= 0.2 or r_div < 0.3:
        assert got == 0.0
    else:
        assert got == pytest.approx((1.1 - p) + 0.2 * r_div)


@pytest.mark.parametrize("p,r_div,expected", [
    (1.0, 1.0, 0.1 + 0.2),          # p = 1 still earns 0.1 (+ diversity)
    (2 / 6, 0.3, 1.1 - 2 / 6 + 0.06),
    (0.2, 1.0, 0.0),                # boundary: p = tau_low is invalid (strict >)
    (0.21, 0.3, 0.89 + 0.06),       # boundary: r_div = tau_div is enough (>=)
    (0.5, 0.2999, 0.0),
])
def test_pasodoble_proposer_reward_boundaries(p, r_div, expected):
    assert pasodoble_proposer_reward(p, r_div) == pytest.approx(expected)


def test_pasodoble_custom_constants():
    assert pasodoble_proposer_reward(0.5, 0.5, tau_low=0.6) == 0.0
    assert pasodoble_proposer_reward(0.5, 0.5, tau_div=0.6) == 0.0
    assert pasodoble_proposer_reward(0.5, 0.5, w=1.0) == pytest.approx(0.6 + 0.5)


@pytest.mark.parametrize("p,valid,trains", [
    (0.0, False, False), (1 / 6, False, False), (0.2, False, False),
    (2 / 6, True, True), (5 / 6, True, True), (1.0, True, False),
])
def test_pasodoble_validity_and_solver_filter(p, valid, trains):
    assert pasodoble_question_valid(p) is valid
    assert pasodoble_solver_trains(p) is trains


def test_pass_rate_and_solver_reward():
    assert pass_rate([True, False, True, True, False, False]) == 0.5
    assert pasodoble_solver_reward(True) == 1.0 and pasodoble_solver_reward(False) == 0.0
    with pytest.raises(ValueError):
        pass_rate([])
    with pytest.raises(ValueError):
        pasodoble_proposer_reward(1.5, 0.5)


# ----------------------------------------------------------------- Ask-E §5.1, App. E

class Outcome(Enum):
    calibrated = "calibrated"
    too_easy = "too_easy"
    too_hard = "too_hard"


@pytest.mark.parametrize("a,b,outcome", [
    (True, False, "calibrated"), (False, True, "calibrated"),
    (True, True, "too_easy"), (False, False, "too_hard"),
])
def test_ask_e_outcome(a, b, outcome):
    assert ask_e_outcome(a, b) == outcome


@pytest.mark.parametrize("outcome,untagged,diversity,expected", [
    ("calibrated", 0, 0.0, 1.0),
    ("too_easy", 0, 0.0, 0.2),
    ("too_hard", 0, 0.0, -0.2),
    ("calibrated", 2, 0.0, 0.9),
    ("too_hard", 4, 0.0, -0.4),
    ("calibrated", 0, 0.5, 1.5),     # full diversity bonus when calibrated
    ("too_hard", 0, 0.5, -0.2),      # uncalibrated (too hard): no bonus at all
    ("too_easy", 1, 0.5, 0.2 - 0.05 + 0.2 * 0.5),  # too easy: a fifth of the bonus (× max(0.2, 0))
    (Outcome.calibrated, 1, 0.2, 1.0 - 0.05 + 0.2),
])
def test_ask_e_reward_table(outcome, untagged, diversity, expected):
    assert ask_e_reward(outcome, untagged, diversity) == pytest.approx(expected)


def test_ask_e_rejects_unknown_outcome():
    with pytest.raises(ValueError):
        ask_e_calibration_reward("missing")
    with pytest.raises(ValueError):
        ask_e_reward("calibrated", -1)


# ----------------------------------------------------------------- AskBench §4.2

@pytest.mark.parametrize("final,targeted,m,expected", [
    (True, 0, 3, -2.0),
    (True, 3, 3, -2.0),     # a final answer before the last turn is premature regardless
    (False, 0, 3, -0.8),
    (False, 1, 3, 0.8),
    (False, 2, 3, 0.8),
    (False, 3, 3, 1.0),
    (False, 1, 1, 1.0),
    (False, 0, 0, -0.8),    # no rubric items: the c_t = 0 case comes first
])
def test_askbench_turn_reward(final, targeted, m, expected):
    assert askbench_turn_reward(final, targeted, m) == expected


@pytest.mark.parametrize("decision,expected", [
    ("correct", 1.0), ("wrong", -1.0), ("still_asking", -2.0), ("still asking", -2.0),
])
def test_askbench_terminal_reward(decision, expected):
    assert askbench_terminal_reward(decision) == expected


def test_askbench_rejects_bad_input():
    with pytest.raises(ValueError):
        askbench_turn_reward(False, 4, 3)
    with pytest.raises(ValueError):
        askbench_terminal_reward("unsure")


# ----------------------------------------------------------------- SOAR App. B.3-B.4

@pytest.mark.parametrize("boxed,verified,contains,expected", [
    (True, True, True, 120.0), (True, True, False, 120.0),
    (True, False, True, 20.0), (True, False, False, 10.0),
    (False, True, True, 0.0), (False, False, False, 0.0),
])
def test_soar_student_reward(boxed, verified, contains, expected):
    assert soar_student_reward(boxed, verified, contains) == expected


@pytest.mark.parametrize("s,expected", [(0.0, 0.0), (1 / 32, 31 / 32), (0.5, 0.5), (1.0, 0.0)])
def test_learnability_reward(s, expected):
    assert learnability_reward(s) == pytest.approx(expected)


def test_learnability_dataset_reward_is_mean():
    assert learnability_dataset_reward([0.0, 0.5, 1.0, 0.25]) == pytest.approx((0 + 0.5 + 0 + 0.75) / 4)


def test_soar_dataset_reward_and_promotion():
    assert soar_dataset_reward([0.10, 0.12, 0.08, 0.10], 0.09) == pytest.approx(0.01)
    assert not soar_should_promote([])
    assert soar_should_promote([0.05, 0.0, 0.0])                 # mean 0.0167 > tau = 0.01
    assert soar_should_promote([0.0, 0.02, 0.015, 0.02])         # last 3: mean 0.0183
    assert not soar_should_promote([0.05, 0.0, 0.0, 0.0])        # the 0.05 left the window
    assert not soar_should_promote([0.02, 0.0, 0.01])            # mean exactly 0.01: not > tau
    assert median_index([0.3, 0.1, 0.2, 0.4]) == 2               # lower median of 4 (r = 4)
    assert median_index([5.0]) == 0


# ----------------------------------------------------------------- advantages

@pytest.mark.parametrize("rewards,expected", [
    ([1.0, 0.0, 0.0, 0.0], [1.0, -1 / 3, -1 / 3, -1 / 3]),
    ([0.5, 0.5], [0.0, 0.0]),
    ([3.0], [0.0]),
    ([], []),
])
def test_rloo(rewards, expected):
    adv = rloo(rewards)
    np.testing.assert_allclose(adv, expected)
    assert abs(adv.sum()) < 1e-12  # soar.txt Prop. 1 relies on this


def test_group_norm_uses_population_std():
    adv = group_norm([1.0, 0.0, 1.0, 0.0], eps=0.0)
    np.testing.assert_allclose(adv, [1.0, -1.0, 1.0, -1.0])   # sigma = 0.5 (population)
    np.testing.assert_array_equal(group_norm([0.1] * 8), np.zeros(8))  # non-diverse: exactly 0
    assert group_norm([]).size == 0
