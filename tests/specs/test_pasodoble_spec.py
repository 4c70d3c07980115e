"""specs/pasodoble.ask as compiled (issue 11, issue 15 item 4): the offline and online
configurations are profiles (the schedule, the update gates), the cold start is 5 epochs
at the paper's lr, the evaluation's sampling (temperature 0.6, top_p 0.95) is what the
engine sends for the evaluated role under both weights, and no parameter of either
configuration is reported unused. No model is loaded (the trained policy is a fake with
only a backend, named as such)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.ir.render import expr_text
from askspec.lang.compiler import compile_file

SPEC = Path(__file__).resolve().parents[2] / "specs" / "pasodoble.ask"
DATA = SPEC.parent / "data"


def compiled(profile: str | None = None, sets: dict[str, str] | None = None):
    res = compile_file(str(SPEC), sets or {}, profile)
    assert res.ok, [d.message for d in res.sink.items]
    return res


@pytest.mark.parametrize("profile", [None, "offline", "online"])
def test_each_configuration_compiles_without_an_unused_parameter(profile):
    res = compiled(profile)
    assert [d.message for d in res.sink.items if d.code == "W501"] == []
    assert res.ir.options["profile"] == (profile or "offline")


def test_offline_is_the_alternating_schedule_and_online_the_gated_one():
    off = compiled().ir
    assert off.schedule.kind == "alternating"
    assert {k: off.schedule.options[k] for k in ("proposer", "solver", "iterations")} == {
        "proposer": 10, "solver": 5, "iterations": 60}  # Table 5 "Offline"
    # offline, Alg. 2 l.24-28: the proposer is updated only when its step buffered a question
    gates = {t.role: expr_text(t.update_when) if t.update_when else None for t in off.training}
    assert gates == {"proposer": "(sum(pushed) > 0)", "solver": None}
    on = compiled("online").ir
    assert on.schedule.kind == "online" and on.schedule.options == {"steps": 600, "games": ["propose"]}
    assert {t.role: expr_text(t.update_when) for t in on.training} == {  # Alg. 1 l.21: D_s != {}
        "proposer": "(sum(pushed) > 0)", "solver": "(sum(pushed) > 0)"}
    # Alg. 2 l.19: a buffered question's peak starts at its pass rate (prev_acc = p_i)
    (questions,) = off.buffers
    assert questions.options["best"] == "pass_rate" and questions.fields["pass_rate"] == "number"
    # both share the rest: stages, models, rewards
    assert [(s.name, s.kind) for s in on.stages] == [(s.name, s.kind) for s in off.stages] == [
        ("base_4shot", "evaluate"), ("sft_proposer", "sft"), ("sft_solver", "sft"), ("coldstart", "evaluate"),
        ("rl", "train"), ("heldout", "evaluate")]


def test_compile_text_shows_each_configuration_s_schedule_with_its_bounds():
    def text(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "askspec.cli", "compile", str(SPEC), "--format", "text", *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    off = text()
    assert "profile: offline" in off and "900 step(s) = 60 iteration(s) × (proposer 10 + solver 5)" in off
    assert "phase proposer: 10 step(s) per iteration, 600 in all; updates proposer, solver frozen; " \
           "propose: proposer ≤ 6, solver ≤ 36 per session" in off
    assert "stage rl train: the schedule (alternating), steps 153–1052" in off
    on = text("--profile", "online")
    assert "profile: online" in on
    assert ("600 step(s); each plays propose and updates proposer (update_when (sum(pushed) > 0)), "
            "solver (update_when (sum(pushed) > 0)); propose: proposer ≤ 6, solver ≤ 36 per session") in on
    assert "stage rl train: the schedule (online), steps 153–752" in on
    assert ("stage heldout evaluate: test against trained and initial weights, 6 sample(s) per item × 2 weights; "
            "pass@1, avg@6 of 'correct'; step 753") in on


def test_the_cold_start_is_five_epochs_of_each_role_s_records_at_lr_1e_5():
    exp = compiled().ir
    for stage, role in (("sft_proposer", "proposer"), ("sft_solver", "solver")):
        opts = next(s for s in exp.stages if s.name == stage).options
        records = (DATA / f"pasodoble_cold_{role}.jsonl").read_text().splitlines()
        assert opts["role"] == role and opts["lr"] == pytest.approx(1e-5)  # App. A
        assert opts["steps"] * opts["batch"] == 5 * len(records)  # App. A: 5 epochs
        assert opts["system"] == "system"  # trained in the system prompt the role is called with
        system = (SPEC.parent / "prompts" / "pasodoble" / f"{role}_system.j2").read_text()  # the role's `system`
        assert {json.loads(r)["system"] for r in records} == {system}


class FakePolicy:
    """Stands in for the solver's trained policy: only the backend that serves its weights."""

    backend = "trained-solver-backend"


def test_the_evaluation_sampling_reaches_the_engine_under_both_weights():
    from askspec.runtime.commands.options import RunOptions
    from askspec.runtime.commands.resolver import ModelResolver
    from askspec.runtime.engine.calls import ModelCalls
    from askspec.runtime.engine.plan import load_dataset
    from askspec.runtime.train.trainer import LocalTrainer

    exp = compiled(sets={"eval_items": "2"}).ir
    heldout = next(s for s in exp.stages if s.name == "heldout")
    assert heldout.options["samples"] == 6 and heldout.options["k"] == [1]  # §4: pass@1 over 6 samples
    datasets = {d.name: load_dataset(d, str(SPEC.parent), 0) for d in exp.datasets}
    trainer = LocalTrainer(exp, params=exp.param_values(), datasets=datasets, seed=0,
                           resolver=ModelResolver(exp, RunOptions(file=str(SPEC)), str(SPEC.parent)), run_dir=None)
    trainer.policies["solver"] = FakePolicy()
    role = exp.role("examinee")
    for initial in (False, True):
        with trainer.serving("initial" if initial else "trained"):
            binding = trainer.resolve("examinee", role.model)  # as the engine asks (session.binding)
        # trained turn: the solver's trained weights; initial turn: the spec's own weights
        assert (binding.backend == "trained-solver-backend") is not initial
        sampling, _ = ModelCalls(recorder=None).sampling("examinee", role, binding)  # what the engine sends
        assert (sampling["temperature"], sampling["top_p"], sampling["max_tokens"]) == (0.6, 0.95, 8192)
    # the roles trained keep the paper's training sampling (Table 5: temperature 0.6, top_p 1.0)
    sampling, _ = ModelCalls(recorder=None).sampling("solver", exp.role("solver"), trainer.resolve("solver", "base"))
    assert (sampling["temperature"], sampling["top_p"], sampling["max_tokens"]) == (0.6, 1.0, 6144)


def trainer_of(exp):
    from askspec.runtime.commands.options import RunOptions
    from askspec.runtime.commands.resolver import ModelResolver
    from askspec.runtime.engine.plan import load_dataset
    from askspec.runtime.train.trainer import LocalTrainer

    datasets = {d.name: load_dataset(d, str(SPEC.parent), 0) for d in exp.datasets}
    return LocalTrainer(exp, params=exp.param_values(), datasets=datasets, seed=0,
                        resolver=ModelResolver(exp, RunOptions(file=str(SPEC)), str(SPEC.parent)), run_dir=None)


@pytest.mark.parametrize("pushed", [20, 60])
def test_an_offline_solver_phase_replays_as_many_questions_as_a_proposer_phase_can_push(pushed):
    """§3.3 / Alg. 2 l.32: each solver step replays a set Q' of buffered questions, looping
    over the buffer circularly. With |Q'| = T_P x I / T_S = 12, one iteration's T_S = 5 solver
    steps replay 60 questions, the most its T_P = 10 proposer steps can push: a buffer of 20
    is replayed three times over (it cycles), one of 60 once each. (One question a step
    replayed 5 of them an iteration, 300 in a run that may push 3,600: never a cycle.)"""
    from collections import Counter
    from types import SimpleNamespace

    from askspec.runtime.scoring.buffers import ReplayBuffer

    exp = compiled().ir
    trainer = trainer_of(exp)
    buf = ReplayBuffer("questions", 100000, "none")
    for i in range(pushed):
        buf.add({"question": f"q{i}", "answer": "1", "pass_rate": 0.5})
    engine = SimpleNamespace(buffers={"questions": buf})
    solver_slots = [sl for sl in trainer.slots if sl.iteration == 1 and sl.phase.name == "solver"]
    assert len(solver_slots) == 5  # T_S
    replayed = Counter()
    for sl in solver_slots:
        plans, ids = trainer.plans(sl, engine)
        assert len(ids["practice"]) == len(plans) == 12  # |Q'|: one session (J answers) per question
        replayed.update(ids["practice"])
    assert set(replayed) == set(range(pushed)) and set(replayed.values()) == {60 // pushed}


def test_the_base_baseline_is_4_shot_on_the_initial_weights_and_coldstart_the_sft_solver():
    """Table 1's baselines (§4 "Baselines"): Base, the initial weights 4-shot; Coldstart, the
    solver after the cold start, zero-shot; both on the held-out problems, as `heldout`."""
    exp = compiled().ir
    stages = {s.name: s for s in exp.stages}
    order = [s.name for s in exp.stages]
    assert order.index("sft_solver") < order.index("coldstart") < order.index("rl")
    heldout = stages["heldout"].options
    for name, game, weights in (("base_4shot", "test_4shot", ["initial"]), ("coldstart", "test", ["trained"])):
        opts = stages[name].options
        assert opts["games"] == [game] and opts["weights"] == weights
        assert {k: opts[k] for k in ("samples", "k", "score")} == {k: heldout[k] for k in ("samples", "k", "score")}
    # the 4-shot prompt: four worked examples, then the problem; on the evaluation's sampling
    from askspec.lang.sandbox import environment

    role = exp.role("examinee_4shot")
    assert role.model == exp.role("examinee").model == "eval_model"
    examples = [json.loads(r) for r in (DATA / "pasodoble_cold_solver.jsonl").read_text().splitlines()][:4]
    assert exp.param_values()["shots"] == 4
    text = environment().from_string(exp.templates[role.prompt].source).render(problem="What is 2 + 2?",
                                                                               examples=examples)
    assert text.count("Problem: ") == 5 and text.count("\\boxed{") == 4
    assert text.rstrip().endswith("Problem: What is 2 + 2?\nSolution:")
