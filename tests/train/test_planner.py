"""Which sessions a training step plays (whole groups, elements cycling), and what the
local trainer refuses, on the five specs (no model is loaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_file
from askspec.runtime.engine.plan import load_dataset
from askspec.runtime.train.trainer import LocalTrainer, TrainingRefused

SPECS = Path(__file__).resolve().parents[2] / "specs"


def trainer(name: str, overrides: dict | None = None, profile: str | None = None) -> LocalTrainer:
    res = compile_file(str(SPECS / name), overrides or {}, profile)
    assert res.ok
    exp = res.ir
    datasets = {d.name: load_dataset(d, str(SPECS), 0) for d in exp.datasets}
    return LocalTrainer(exp, params=exp.param_values(), datasets=datasets, seed=0, resolver=None, run_dir=None)


def test_ask_e_training_plays_groups_of_g_repeats_of_one_pair():
    """Ask-E §5.1: 256 rollouts per step in groups of G = 16 repeats of one boundary pair."""
    t = trainer("ask_e.ask", profile="training")
    plans = t.planner.plans(1)
    assert len(plans) == 256 and {p.group_size for p in plans} == {16}
    groups = [plans[i:i + 16] for i in range(0, 256, 16)]
    assert len({g[0].group_id for g in groups}) == 16
    for g in groups:  # one pair per group
        assert len({(p.bindings["a"], p.bindings["b"]) for p in g}) == 1
    assert (groups[0][0].bindings["a"], groups[0][0].bindings["b"]) == ("boundary_small", "boundary_sympy")
    assert (groups[1][0].bindings["a"], groups[1][0].bindings["b"]) == ("boundary_small", "boundary_short")  # the next pair
    assert len({p.seed for p in groups[0]}) == 16
    # then App. G's downstream stage: 60 held-out problems x 8 samples x (trained, initial)
    assert t.steps == 201 and t.planned_sessions() == 200 * 256 + 60 * 8 * 2



@pytest.mark.parametrize("profile", ["benchmark", "training"])
def test_ask_e_trains_one_update_stale_beside_its_stages(profile):
    """App. E's asynchronous rollouts are the spec's default; the local trainer runs them
    beside the `rl` and `downstream_eval` stages (it refused them before)."""
    t = trainer("ask_e.ask", profile=profile)
    assert t.asynchronous and t.by_role["questioner"].max_staleness == 1
    assert [s.phase.stage for s in t.slots[-2:]] == ["rl", "downstream_eval"]
    assert not trainer("ask_e.ask", {"staleness": 0}, profile).asynchronous

def test_elements_cycle_and_steps_are_deterministic():
    t = trainer("arith.ask")
    assert [len(t.planner.plans(k)) for k in (1, 2, 3)] == [8, 8, 8]
    items = [p.bindings["item"]["id"] for k in range(1, 34) for p in t.planner.plans(k)[::4]]
    assert items[:2] == ["a01", "a02"] and items[64:66] == ["a01", "a02"]  # 64 problems: the second pass
    again = trainer("arith.ask")
    assert [p.seed for p in again.planner.plans(17)] == [p.seed for p in t.planner.plans(17)]
    assert t.planner.plans(17)[0].seed != t.planner.plans(1)[0].seed  # a new pass draws new seeds
    assert all(p.step == 3 for p in t.planner.plans(3))


def test_reasoning_arena_batch_rounds_up_to_whole_groups():
    t = trainer("reasoning_arena.ask")
    assert len(t.planner.plans(1)) == 480 and {p.group_size for p in t.planner.plans(1)} == {8}
    t = trainer("reasoning_arena.ask", {"group_size": "3"})
    # batch 480 is a multiple of 3; 5 problems cycle
    assert len(t.planner.plans(1)) == 480


def test_soar_plans_its_nested_schedule():
    t = trainer("soar.ask")
    # one teach session per outer step; each step owns the indices of its inner sessions
    assert [sl.phase.name for sl in t.slots[:2]] == ["outer", "outer"]
    # the stages: 200 outer steps, PS (1 step), a fresh student on PQ (1,500 steps), PQ (1 step),
    # Hard-Only: a fresh student on the train split (1,500 steps), evaluated (1 step), the teacher
    # evaluation: a fresh student on questions sampled from the teacher (1,500 steps), evaluated (1 step)
    assert [sl.phase.kind for sl in t.slots].count("play") == 200
    assert [(sl.phase.stage, sl.phase.kind) for sl in t.slots[200:202]] == [("ps", "evaluate"), ("pq_student", "retrain")]
    assert [(sl.phase.stage, sl.phase.kind) for sl in t.slots[1701:1703]] == [("pq", "evaluate"), ("hard_only", "retrain")]
    assert [(sl.phase.stage, sl.phase.kind) for sl in t.slots[3202:3204]] == [("hard_only_eval", "evaluate"),
                                                                              ("teacher_student", "retrain")]
    assert t.steps == 200 + 1 + 1500 + 1 + 1500 + 1 + 1500 + 1 and t.slots[-1].phase.stage == "teacher_eval"
    assert t.step_sessions(t.slots[201]) == 256  # the student's batch: 8 questions x group 32
    assert t.step_sessions(t.slots[3203]) == 1 + 256  # its first step plays the sampling game once, then the batch
    assert t.step_sessions(t.slots[3204]) == 256
    assert t.step_sessions(t.slots[200]) == 30 * 32 * 2  # 30 test problems x 32 samples x (trained, initial)
    assert t.slots[0].phase.roles == ("teacher",) and t.slots[0].phase.plain == ("teach",)
    assert {g.name for g in t.games} == {"teach", "practice", "evaluate", "test", "write"}
    inner = t.inner
    assert inner is not None and inner.grounded
    # baseline M + g datasets x r copies x ((10 + 5) steps x 8 questions x group 32, + M), where
    # M = 64 reward questions or the whole data set when smaller
    m = min(64, len(inner.collections["hard"]))
    assert inner.max_sessions() == m + 4 * 4 * ((10 + 5) * 256 + m)
    assert t.step_sessions(t.slots[0]) == 1 + inner.max_sessions()
    assert t.by_role["student"].steps == 15 and t.by_role["teacher"].steps == 200
    # the learnability baseline (Intrinsic-T) plays only the teach game: no inner loop
    t = trainer("soar.ask", {"teacher_reward": "intrinsic"})
    assert t.inner is not None and not t.inner.grounded and t.step_sessions(t.slots[0]) == 1


def test_gspo_clip_sets_both_sides_unless_one_is_given():
    from askspec.lang.compiler import compile_source
    from askspec.runtime.train.config import config_from_ir

    head = ('model m = hf("smollm2-135m-instruct")\nrole q { model = m; trained; memory = none; prompt = "x" }\n'
            'game g sample 2 { a = ask q\n reward q = 1.0 }\n')
    for algo, want in [("gspo", (0.0003, 0.0004)), ("gspo(clip = 0.3)", (0.3, 0.3)),
                       ("gspo(clip = 0.3, clip_high = 0.5)", (0.3, 0.5)), ("cispo", (1.0, 2.0))]:
        res = compile_source("t.ask", head + f"train q with {algo}")
        assert res.ok, algo
        cfg = config_from_ir(res.ir.training[0], res.ir)
        assert (cfg.clip_low, cfg.clip_high) == pytest.approx(want), algo


def test_pasodoble_stages_alternating_phases_and_sizes():
    t = trainer("pasodoble.ask", {"proposer_steps": "2", "solver_steps": "1", "iterations": "2", "proposals": "3",
                                  "solutions": "2", "cold_steps": "1", "eval_items": "2", "eval_samples": "3"})
    assert [(s.step, s.phase.name, s.phase.stage, s.iteration, s.n) for s in t.slots] == [
        (1, "base_4shot", "base_4shot", 1, 1),
        (2, "sft_proposer", "sft_proposer", 1, 1), (3, "sft_solver", "sft_solver", 1, 1),
        (4, "coldstart", "coldstart", 1, 1),
        (5, "proposer", "rl", 1, 1), (6, "proposer", "rl", 1, 2), (7, "solver", "rl", 1, 1),
        (8, "proposer", "rl", 2, 3), (9, "proposer", "rl", 2, 4), (10, "solver", "rl", 2, 2),
        (11, "heldout", "heldout", 1, 1)]
    prop, solv = t.slots[4].phase, t.slots[6].phase
    assert (prop.roles, prop.plain, prop.replay) == (("proposer",), ("propose",), ())
    assert (solv.roles, solv.plain, solv.replay) == (("solver",), (), ("practice",))
    # one passage a proposer step, `replay_questions` buffered questions a solver step: the
    # GRPO group is the `sample` call's siblings (the I questions, the J answers), not
    # repeated sessions
    assert [p.group_size for p in t.planners["proposer"].plans(1)] == [1]
    assert (solv.replay_items["practice"], solv.groups["practice"]) == (12, 1)
    # the lr schedule of each role counts its own updates
    assert t.by_role["proposer"].steps == 4 and t.by_role["solver"].steps == 2
    # session indices of steps never overlap; the evaluations: 2 items x 3 samples x 1 weights
    # (base_4shot, coldstart), then x 2 weights (heldout)
    assert t.planner_sessions_before(10) == 6 + 6 + 4 * 1 + 2 * 12 and t.step_sessions(t.slots[10]) == 12


def test_online_with_two_roles_is_sized_by_every_train_block():
    from askspec.lang.compiler import compile_source

    src = ('model m = hf("smollm2-135m-instruct")\n'
           'role a { model = m; trained; memory = none; prompt = "x" }\n'
           'role b { model = m; trained; memory = none; prompt = "y" }\n'
           'game g for i in [1, 2, 3] { x = ask a\n y = ask b\n reward a = 1.0\n reward b = 1.0 }\n'
           'train a with grpo { group = 2; batch = 2; steps = 3 }\n'
           'train b with grpo { group = 4; batch = 8; steps = 5 }\n')
    res = compile_source("t.ask", src)
    assert res.ok
    t = LocalTrainer(res.ir, params={}, datasets={}, seed=0, resolver=None, run_dir=None)
    assert t.steps == 5 and [s.phase.roles for s in t.slots] == [("a", "b")] * 5
    plans = t.planner.plans(1)
    assert len(plans) == 8 and {p.group_size for p in plans} == {4}  # the larger block's group and batch


def test_compile_text_shows_the_schedule_with_step_and_call_bounds():
    from askspec.ir.render import to_text as render_text

    res = compile_file(str(SPECS / "pasodoble.ask"), {"proposer_steps": "2", "solver_steps": "1", "iterations": "2"})
    text = render_text(res.ir)
    assert "  6 step(s) = 2 iteration(s) × (proposer 2 + solver 1)" in text
    assert ("  phase proposer: 2 step(s) per iteration, 4 in all; updates proposer, solver frozen; "
            "propose: proposer ≤ 6, solver ≤ 36 per session") in text
    assert "  phase solver: 1 step(s) per iteration, 2 in all; updates solver, proposer frozen" in text
