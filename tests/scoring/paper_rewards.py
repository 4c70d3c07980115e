"""Reference reward functions of the five papers, as pure functions: test oracles.

Defaults are the papers' constants (section cited at each function). The engine never
calls these: specs express the same formulas in the reward language, and
tests/scoring/test_spec_rewards_match_papers.py checks that both agree. Outcomes may be
given as strings or as enums whose ``.value`` is the string. The advantage estimators
(`rloo`, `group_norm`) are the reference a trainer's estimators are compared against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# --------------------------------------------------------------------------- PasoDoble
# papers/pasodoble.txt §3.3 (rewards), §3.4-3.5 (solver filter), App. B Table 5
# (tau_low = 0.2, tau_sim = 0.3, tau_div = 0.3, w = 0.2, |H| = 100, I = J = 6).

PASODOBLE_TAU_LOW = 0.2
PASODOBLE_TAU_DIV = 0.3
PASODOBLE_W = 0.2


def pass_rate(correct: Sequence[bool]) -> float:
    """p_i = (1/J) sum_j 1[a_ij = a_i*] (§3.3)."""
    if len(correct) == 0:
        raise ValueError("pass rate of zero solver attempts is undefined")
    return sum(1.0 for c in correct if c) / len(correct)


def pasodoble_difficulty(p: float) -> float:
    """r_diff = 1.1 - p (§3.3): even p = 1 earns 0.1, more than an invalid question."""
    return 1.1 - p


def pasodoble_question_valid(p: float, tau_low: float = PASODOBLE_TAU_LOW) -> bool:
    """Valid iff p > tau_low (§3.3: "invalid when p_i <= tau_low"; §5 "p_i > tau_low as
    what we do in training"). With J = 6, p is a multiple of 1/6 and never equals 0.2."""
    return p > tau_low


def pasodoble_proposer_reward(p: float, r_div: float, tau_low: float = PASODOBLE_TAU_LOW,
                              tau_div: float = PASODOBLE_TAU_DIV, w: float = PASODOBLE_W) -> float:
    """r_p = (1.1 - p) + w * r_div if p > tau_low and r_div >= tau_div, else 0 (§3.3).

    p = 1 is rewarded (0.1 + w * r_div); the strict/non-strict boundaries follow the
    displayed formula (the prose once writes p >= tau_low; the formula, the "invalid when
    p <= tau_low" sentence and §5 all say strict).
    """
    if not (0.0 <= p <= 1.0):
        raise ValueError("pass rate p must be in [0, 1]")
    if p > tau_low and r_div >= tau_div:
        return pasodoble_difficulty(p) + w * r_div
    return 0.0


def pasodoble_solver_trains(p: float, tau_low: float = PASODOBLE_TAU_LOW) -> bool:
    """The solver trains on a question iff tau_low < p < 1 (Alg. 1 line 16: Valid and
    p < 1; §5: "we only retain questions where tau_low < p_i < 1")."""
    return p > tau_low and p < 1.0


def pasodoble_solver_reward(correct: bool) -> float:
    """r_s = 1[a_ij = a_i*] (§3.4)."""
    return 1.0 if correct else 0.0


# --------------------------------------------------------------------------- Ask-E
# papers/ask_e.txt §5.1 "Reward shape", App. E "Embedding-diversity bonus".

ASK_E_CALIBRATION = {"calibrated": 1.0, "too_easy": 0.2, "too_hard": -0.2}
ASK_E_FORMAT_PENALTY = 0.05


def _key(outcome: Any) -> str:
    return str(getattr(outcome, "value", outcome))


def ask_e_outcome(a_correct: bool, b_correct: bool) -> str:
    """calibrated iff exactly one boundary model matches the key; too_easy both; too_hard neither."""
    if a_correct != b_correct:
        return "calibrated"
    return "too_easy" if a_correct else "too_hard"


def ask_e_calibration_reward(outcome: Any) -> float:
    """+1.0 calibrated, +0.2 too easy, -0.2 too hard (§5.1)."""
    key = _key(outcome)
    if key not in ASK_E_CALIBRATION:
        raise ValueError(f"unknown Ask-E outcome {key!r}")
    return ASK_E_CALIBRATION[key]


def ask_e_reward(outcome: Any, untagged_turns: int = 0, diversity: float = 0.0,
                 penalty: float = ASK_E_FORMAT_PENALTY) -> float:
    """Calibration reward - 0.05 per turn lacking the required tags + gated diversity.

    ``diversity`` is the embedding bonus alpha * (1 - mean kNN cos-sim) (see
    diversity.EmbeddingDiversity), gated by max(calibration, 0) (ask_e_bonus below).
    """
    if untagged_turns < 0:
        raise ValueError("untagged_turns must be >= 0")
    cal = ask_e_calibration_reward(outcome)
    return cal - penalty * untagged_turns + ask_e_bonus(outcome, diversity)


def ask_e_bonus(outcome: Any, diversity: float) -> float:
    """Ask-E's gated diversity term (ask_e.txt App. E): "the diversity term is multiplied
    by the (non-negative-clipped) calibration reward", i.e. diversity * max(calibration
    reward, 0): the whole bonus when calibrated (1.0), a fifth when too easy (0.2), none
    when too hard (-0.2 clips to 0). The paper's gloss "so diversity is only rewarded when
    the question is calibrated" would need an indicator, not a clip; the formula is the
    rule (the clip changes only too_hard).
    """
    return float(diversity) * max(ask_e_calibration_reward(outcome), 0.0)


askE_bonus = ask_e_bonus  # name used in the design notes


# --------------------------------------------------------------------------- AskBench
# papers/askbench.txt §4.2 "Reward Design".

ASKBENCH_TERMINAL = {"correct": 1.0, "wrong": -1.0, "still_asking": -2.0}


def askbench_turn_reward(is_final_answer: bool, targeted: int, rubric_size: int) -> float:
    """Intermediate turn reward r_t (§4.2), cases checked in the paper's order:
    -2.0 premature final answer; -0.8 clarification targeting no rubric item;
    +0.8 some (0 < c_t < m); +1.0 all (c_t = m). With m = 0 the second case applies."""
    if targeted < 0 or rubric_size < 0 or targeted > rubric_size:
        raise ValueError("need 0 <= targeted <= rubric_size")
    if is_final_answer:
        return -2.0
    if targeted == 0:
        return -0.8
    if targeted < rubric_size:
        return 0.8
    return 1.0


def askbench_terminal_reward(decision: Any) -> float:
    """Terminal reward r_T (§4.2): +1 correct, -1 wrong, -2 still asking on the last turn."""
    key = _key(decision).replace(" ", "_")
    if key not in ASKBENCH_TERMINAL:
        raise ValueError(f"unknown AskBench decision {key!r}")
    return ASKBENCH_TERMINAL[key]


# --------------------------------------------------------------------------- SOAR
# papers/soar.txt App. B.3 (student reward, promotion), B.4 (learnability), §3 / B.2 (RLOO).

SOAR_STUDENT_REWARDS = (120.0, 20.0, 10.0, 0.0)


def soar_student_reward(has_boxed: bool, verified: bool, answer_in_response: bool) -> float:
    """Student shaping (App. B.3): 120 boxed and math-verify equal; 20 boxed, not equal,
    but the gold answer appears in the extracted answer (a in y_ans); 10 boxed otherwise;
    0 without a boxed answer."""
    if not has_boxed:
        return 0.0
    if verified:
        return 120.0
    return 20.0 if answer_in_response else 10.0


def learnability_reward(success_rate: float) -> float:
    """Learnability baseline (App. B.4, Eq. 8): 0 if s = 0, else 1 - s."""
    if not (0.0 <= success_rate <= 1.0):
        raise ValueError("success rate must be in [0, 1]")
    return 0.0 if success_rate == 0.0 else 1.0 - success_rate


def learnability_dataset_reward(success_rates: Sequence[float]) -> float:
    """R_k = mean_i r_i over the dataset (App. B.4); every rollout gets this value."""
    if len(success_rates) == 0:
        raise ValueError("empty dataset")
    return float(np.mean([learnability_reward(s) for s in success_rates]))


def soar_dataset_reward(trained_accuracies: Sequence[float], baseline_accuracy: float) -> float:
    """R_k = (1/r) sum_j [ACC(theta'_kj, Q_R) - ACC(theta, Q_R)] (Alg. 1, r = 4)."""
    if len(trained_accuracies) == 0:
        raise ValueError("need at least one trained student")
    return float(np.mean(trained_accuracies)) - float(baseline_accuracy)


def soar_should_promote(mean_teacher_rewards: Sequence[float], window: int = 3,
                        tau: float = 0.01) -> bool:
    """Promote when the moving average over the last ``window`` mean teacher rewards
    exceeds tau (App. B.3 / Fig. 16: 3-step moving average, tau = 0.01)."""
    if window < 1:
        raise ValueError("window must be >= 1")
    recent = list(mean_teacher_rewards)[-window:]
    return bool(recent) and float(np.mean(recent)) > tau


def median_index(values: Sequence[float]) -> int:
    """Index of the median element (the lower median for an even count; stable on ties),
    used to pick the promoted student among the r trained on the best dataset."""
    if len(values) == 0:
        raise ValueError("empty sequence")
    order = sorted(range(len(values)), key=lambda k: (values[k], k))
    return order[(len(values) - 1) // 2]


# --------------------------------------------------------------------------- advantages

def rloo(rewards: Sequence[float]) -> np.ndarray:
    """RLOO advantages A_i = R_i - mean_{j != i} R_j (soar.txt Eq. 4); they sum to 0.
    A group of one has no leave-one-out baseline: its advantage is 0."""
    r = np.asarray(rewards, dtype=np.float64)
    g = r.size
    if g <= 1:
        return np.zeros(g)
    return r - (r.sum() - r) / (g - 1)


def group_norm(rewards: Sequence[float], eps: float = 1e-6) -> np.ndarray:
    """Group-normalised advantages (R_i - mu) / (sigma + eps) with the population sigma
    (reasoning_arena.txt Eq. 2); exactly 0 for a non-diverse group."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return r.copy()
    if np.all(r == r[0]):
        return np.zeros(r.size)
    mu = r.mean()
    return (r - mu) / (np.sqrt(np.mean((r - mu) ** 2)) + eps)
