"""The reward formulas written in the specs agree with the reference implementations of
the papers' rewards (paper_rewards.py beside it), table-driven over the papers'
constants: the spec language expresses the paper, evaluated by the runtime evaluator."""

from __future__ import annotations

from pathlib import Path

import pytest

from askspec.ir import model as ir
from askspec.lang.compiler import compile_file
from askspec.runtime.engine.evaluator import Env, evaluate

from paper_rewards import ask_e_bonus, ask_e_calibration_reward, pasodoble_proposer_reward

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _steps(steps):
    for s in steps:
        yield s
        for attr in ("body", "orelse"):
            yield from _steps(getattr(s, attr, None) or [])
        for b in getattr(s, "branches", None) or []:
            yield from _steps(b.body)


def _reward(spec: str, role: str, name: str) -> tuple[ir.Experiment, ir.RewardStep]:
    exp = compile_file(str(SPECS / spec)).ir
    for g in exp.games:
        for s in _steps(g.body):
            # the formula, not a constant fallback such as `reward qa as proposer = 0`
            if s.kind == "reward" and s.role == role and s.name == name and s.value.kind != "lit":
                return exp, s
    raise AssertionError(f"no reward {role}/{name} in {spec}")


@pytest.mark.parametrize("p", [0.0, 1 / 6, 0.2, 2 / 6, 0.5, 5 / 6, 1.0])
@pytest.mark.parametrize("r_div", [0.0, 0.29, 0.3, 0.31, 0.7, 1.0])
def test_pasodoble_proposer_reward(p, r_div):
    exp, step = _reward("pasodoble.ask", "proposer", "proposer")
    value = evaluate(step.value, Env(vars={"p": p, "r_div": r_div}, params=exp.param_values()))
    assert value == pytest.approx(pasodoble_proposer_reward(p, r_div))
    if p <= 0.2 or r_div < 0.3:
        assert value == 0


@pytest.mark.parametrize("outcome", ["calibrated", "too_easy", "too_hard"])
@pytest.mark.parametrize("untagged", [0, 1, 3])
def test_ask_e_calibration_reward(outcome, untagged):
    exp, step = _reward("ask_e.ask", "questioner", "calibration")
    env_vars = {"outcome": outcome, "untagged": untagged,
                "calibration": ask_e_calibration_reward(outcome)}
    steps = list(_steps(exp.games[0].body))
    final = [s for s in steps if s.kind == "reward" and s.name == "calibration"][-1]
    calib = next(s for s in steps if s.kind == "assign" and s.name == "calibration")
    env = Env(vars=env_vars, params=exp.param_values())
    assert evaluate(calib.value, env) == pytest.approx(ask_e_calibration_reward(outcome))
    assert evaluate(final.value, env) == pytest.approx(ask_e_calibration_reward(outcome) - 0.05 * untagged)


@pytest.mark.parametrize("outcome", ["calibrated", "too_easy", "too_hard"])
@pytest.mark.parametrize("bonus", [0.0, 0.3, 0.9])
def test_ask_e_diversity_reward(outcome, bonus):
    """App. E: the bonus times the non-negative-clipped calibration reward, on every outcome."""
    exp, step = _reward("ask_e.ask", "questioner", "diversity")
    env = Env(vars={"outcome": outcome, "novelty_bonus": bonus, "calibration": ask_e_calibration_reward(outcome)},
              params=exp.param_values())
    assert evaluate(step.value, env) == pytest.approx(ask_e_bonus(outcome, bonus))
