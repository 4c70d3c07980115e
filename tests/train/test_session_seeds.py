"""Fresh sampling seeds on every pass, in every schedule (issue #30 item 4): a session's
seed follows its stage, phase and step, its element and its member, so no two sessions of
a run share one unless the spec asks for it (an evaluate stage's trained and initial
weights: a paired comparison); the store records each session's seed (`sessions.seed`),
so a session can be replayed alone.

Before the fix an alternating schedule's phases, planning the same game from the same
seed, replayed each other's seeds (the solver phase sampled the items the proposer phase
had, under its seeds: byte-identical replies when the update in between was skipped), an
evaluate stage played the same seeds as every other evaluate stage of its games, and a
refill round that met an element twice gave both groups one seed per member.

The planner tests need no model; the end-to-end ones run `askspec run` on the tiny random
Llama of tests/conftest.py (8 new tokens, a few steps), in the test's own process."""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_file
from askspec.runtime.engine.plan import SessionPlan, load_dataset, plan_sessions
from askspec.runtime.store.views import open_store
from askspec.runtime.train import stages
from askspec.runtime.train.trainer import LocalTrainer

pytestmark = pytest.mark.slow  # (askspec processes, a Ray cluster or a real model)

SPECS = Path(__file__).parent / "specs"
ALTERNATING = SPECS / "tiny_alternating_shared.ask"  # both phases play the same game
STAGED = SPECS / "tiny_stages_seeds.ask"  # evaluate, train, evaluate the same game
NESTED = SPECS / "tiny_nested.ask"


def _trainer(spec: Path) -> LocalTrainer:
    res = compile_file(str(spec))
    assert res.ok, res.diagnostics
    seed = int(res.ir.options.get("seed", 0) or 0)
    datasets = {d.name: load_dataset(d, str(spec.parent), seed) for d in res.ir.datasets}
    return LocalTrainer(res.ir, params=res.ir.param_values(), datasets=datasets, seed=seed, resolver=None, run_dir=None)


def _shared(seeds: list[int]) -> dict[int, int]:
    return {s: n for s, n in collections.Counter(seeds).items() if n > 1}


# ---------------------------------------------------------------------------------------
# the plans (no model)


def test_alternating_phases_over_one_game_sample_under_seeds_of_their_own():
    t = _trainer(ALTERNATING)
    by_step = {sl.step: t.plans(sl, engine=None)[0] for sl in t.slots}
    # the case of the issue: the solver phase (step 2) walks the elements the proposer phase (step 1) walked
    assert [t.slots[0].phase.name, t.slots[1].phase.name] == ["proposer", "solver"]
    assert [p.bindings for p in by_step[1]] == [p.bindings for p in by_step[2]]
    plans = [p for ps in by_step.values() for p in ps]
    assert len(plans) == 8 and _shared([p.seed for p in plans]) == {}
    # a resumed run (a new trainer of the same spec and seed) replays every step under the same seeds
    again = _trainer(ALTERNATING)
    assert [p.seed for sl in again.slots for p in again.plans(sl, engine=None)[0]] == [p.seed for p in plans]


def test_a_refill_round_that_meets_an_element_twice_seeds_each_group_afresh():
    t = _trainer(ALTERNATING)
    planner = t.planners["proposer"]  # 2 elements, groups of 2
    refill = planner.refill(1, 1, 1, 8, 0)  # 4 groups: each element twice
    assert len(refill) == 8 and len({p.group_id for p in refill}) == 4
    assert collections.Counter(p.item_index for p in refill) == {0: 4, 1: 4}
    step = planner.plans(1)
    assert _shared([p.seed for p in refill + step]) == {}


def test_evaluate_stages_pair_their_weights_and_nothing_else():
    t = _trainer(STAGED)
    plans: list[SessionPlan] = []
    for sl in t.slots:
        if sl.phase.kind == "evaluate":
            stage = next(s for s in t.exp.stages if s.name == sl.phase.stage)
            by_weights = stages.eval_plans(stage, t.evaluated[sl.phase.name], t.seed, sl.step, t.index0[sl.step - 1])
            trained, initial = by_weights["trained"], by_weights["initial"]
            assert [p.seed for p in trained] == [p.seed for p in initial]  # the paired comparison the stage asks for
            plans += trained
        elif sl.phase.kind == "play":
            plans += t.plans(sl, engine=None)[0]
    assert [p.stage for p in plans] == ["before"] * 4 + ["rl"] * 4 + ["after"] * 4
    assert _shared([p.seed for p in plans]) == {}


# ---------------------------------------------------------------------------------------
# the runs: every session's seed recorded, none shared


@pytest.fixture(scope="module")
def runs(tmp_path_factory, e2e, tiny_model) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("seeds")
    # in this process: three fresh interpreters would import torch and transformers three times
    return {spec.stem: e2e.run_here(spec, out / spec.stem, "--set", f'weights="{tiny_model}"')
            for spec in (ALTERNATING, STAGED, NESTED)}


def _sessions(run_dir: Path) -> list[tuple]:
    con = open_store(run_dir)
    return con.execute("SELECT session_id, seed, game, stage, step, weights, params FROM sessions "
                       "ORDER BY session_id").fetchall()


def test_an_alternating_run_shares_no_seed(runs):
    rows = _sessions(runs[ALTERNATING.stem])
    assert len(rows) == 8 and all(seed is not None for _, seed, *_ in rows)
    assert _shared([seed for _, seed, *_ in rows]) == {}
    # the seeds recorded are the ones planned
    t = _trainer(ALTERNATING)
    planned = {p.session_id: p.seed for sl in t.slots for p in t.plans(sl, engine=None)[0]}
    assert {sid: seed for sid, seed, *_ in rows} == planned


def test_a_nested_run_shares_no_seed(runs):
    rows = _sessions(runs[NESTED.stem])
    # the outer sessions, the baseline's and each copy's evaluations, every copy's inner steps
    assert len(rows) > 40 and {g for _, _, g, *_ in rows} == {"teach", "practice", "evaluate"}
    assert all(seed is not None for _, seed, *_ in rows)
    assert _shared([seed for _, seed, *_ in rows]) == {}


def test_a_staged_run_shares_seeds_only_between_an_evaluate_stages_weights(runs):
    rows = _sessions(runs[STAGED.stem])
    assert len(rows) == 20 and all(seed is not None for _, seed, *_ in rows)
    pairs: dict[int, list[tuple]] = collections.defaultdict(list)
    for sid, seed, game, stage, step, weights, params in rows:
        pairs[seed].append((game, stage, weights, params))
    for seed, sessions in pairs.items():
        if len(sessions) == 1:
            continue
        # a seed two sessions share: one evaluate stage's element, once per weights
        assert len(sessions) == 2, sessions
        (g1, st1, w1, p1), (g2, st2, w2, p2) = sessions
        assert (g1, st1, p1) == (g2, st2, p2) and {w1, w2} == {"trained", "initial"}
    by_stage = collections.Counter(stage for _, _, _, stage, *_ in rows)
    assert by_stage == {"before": 8, "rl": 4, "after": 8}
    assert len(pairs) == 4 + 4 + 4  # each stage's seeds its own


# ---------------------------------------------------------------------------------------
# a session replayed alone


def test_a_session_replays_alone_under_its_recorded_seed(tmp_path, e2e, tiny_model):
    """An evaluation run at --concurrency 1 (hf's exact promise), then its second session
    played alone, in a fresh engine, from what the store recorded of it (game, bindings,
    seed): the same replies. Under another seed the replies differ, so the recorded seed
    is what made them."""
    from askspec.ir.canonical import experiment_hash, from_json, to_json
    from askspec.runtime.commands.resolver import local_resolver
    from askspec.runtime.engine.session import Engine
    from askspec.runtime.engine.stateful import StatefulScorers
    from askspec.runtime.store.writer import RunWriter

    run_dir = e2e.run_here(ALTERNATING, tmp_path / "runs", "--eval-only", "--concurrency", "1",
                           "--set", f'weights="{tiny_model}"')
    con = open_store(run_dir)
    sessions = con.execute("SELECT session_id, game, params, seed, index FROM sessions ORDER BY session_id").fetchall()
    assert len(sessions) == 2 and _shared([s[3] for s in sessions]) == {}
    sid, game, params, seed, index = sessions[1]
    assert index == 1  # replayed below as the only session, at index 0

    def texts(con, session_id: str) -> list[str]:
        return [t for (t,) in con.execute("SELECT text FROM turns WHERE session_id = ? ORDER BY turn_index",
                                          [session_id]).fetchall()]

    recorded = texts(con, sid)
    assert len(recorded) == 2 and all(recorded)

    exp = from_json((run_dir / "ir.json").read_text())  # the IR as run (its weights the tiny model)
    bindings = json.loads(params) if isinstance(params, str) else params
    run_seed = int(exp.options.get("seed", 0) or 0)
    datasets = {d.name: load_dataset(d, str(run_dir / "spec"), run_seed) for d in exp.datasets}
    # an evaluation run's seeds are its plan's: the same run seed, the same session seeds
    assert [s[3] for s in sessions] == [p.seed for p in plan_sessions(exp, exp.param_values(), datasets, run_seed)]

    def replay(session_seed: int, out: Path) -> list[str]:
        writer = RunWriter.create(out, experiment=exp.name, experiment_hash=experiment_hash(exp), ir_json=to_json(exp),
                                  spec_files={}, seed=run_seed, roles={}, params=exp.param_values(),
                                  planned_sessions=1, argv=["replay"])
        engine = Engine(exp, params=exp.param_values(), datasets=datasets, writer=writer, seed=run_seed,
                        resolve_model=local_resolver(exp, str(run_dir / "spec")).resolve, stateful=StatefulScorers(),
                        concurrency=1)
        plan = SessionPlan(index=0, session_id="r000000", game=game, group_id=None, group_size=1, bindings=bindings,
                           seed=session_seed)
        asyncio.run(engine.run_phase([plan]))
        writer.finish("finished")
        got = open_store(writer.run_dir)
        assert got.execute("SELECT seed FROM sessions").fetchall() == [(session_seed,)]
        return texts(got, "r000000")

    assert replay(seed, tmp_path / "again") == recorded
    assert replay(seed + 1, tmp_path / "other") != recorded
