"""The `resample` route action (Reasoning Arena's RLVR baseline, reasoning_arena.txt §3:
a non-diverse group's traces are discarded and the engine samples more rollouts to fill
the batch): such a group is not trained on, and a training step plays other groups in its
place until its batch is full, for a bounded number of rounds."""

from __future__ import annotations

import asyncio
from pathlib import Path

from askspec.lang.compiler import compile_file, compile_source
from askspec.runtime.engine.plan import load_dataset
from askspec.runtime.train import trainer as tr
from askspec.runtime.train.batch import SessionRecord, build_batch

SPECS = Path(__file__).resolve().parents[2] / "specs"


def trainer(overrides: dict):
    res = compile_file(str(SPECS / "reasoning_arena.ask"), overrides)
    assert res.ok
    datasets = {d.name: load_dataset(d, str(SPECS), 0) for d in res.ir.datasets}
    return tr.LocalTrainer(res.ir, params=res.ir.param_values(), datasets=datasets, seed=0, resolver=None, run_dir=None)


def test_refill_plays_the_next_problems_with_their_own_seeds_and_ids():
    t = trainer({"group_size": "4", "routing": "rlvr"})
    step = t.planner.plans(1)
    assert len(step) == 480
    refill = t.planner.refill(1, 1, 1, 8, 0)
    assert len(refill) == 8 and len({p.group_id for p in refill}) == 2
    # the problems after the step's own, in the data's order
    after = len(step) // 4
    items = [p.bindings["item"]["id"] for p in refill[::4]]
    order = [p.bindings["item"]["id"] for p in t.planner.plans(2)[::4]]
    assert items == order[:2] and (after % 300) == 120
    ids = {p.session_id for p in step} | {p.session_id for p in t.planner.plans(2)}
    assert not ids & {p.session_id for p in refill}
    assert not {p.index for p in step} & {p.index for p in refill}
    assert {p.seed for p in refill}.isdisjoint({p.seed for p in t.planner.plans(2)})
    assert [p.seed for p in refill] == [p.seed for p in trainer({"group_size": "4", "routing": "rlvr"}).planner.refill(1, 1, 1, 8, 0)]
    later = t.planner.refill(1, 1, 2, 4, 2)  # a second round skips the groups the first one used
    assert later[0].bindings["item"]["id"] == order[2]


class FakeEngine:
    """Stands in for the session engine: records the plans it plays and routes each group
    `resample` while `resampling(round)` says so (a fake, for the trainer's refill loop)."""

    def __init__(self, log, resample_rounds: int) -> None:
        self.log, self.resample_rounds, self.played = log, resample_rounds, []

    async def run_phase(self, plans, replay_ids=None):
        self.played.append(plans)
        round_ = len(self.played) - 1
        for p in plans:
            if p.group_id:
                self.log.routes[(p.group_id, "policy")] = "resample" if round_ < self.resample_rounds else "keep"


class Log:
    def __init__(self) -> None:
        self.routes: dict = {}


def test_the_step_refills_until_no_group_is_resampled():
    t = trainer({"group_size": "4", "routing": "rlvr"})
    t.planner.batch = 8  # two groups per step, for a small check
    log = Log()
    engine = FakeEngine(log, resample_rounds=2)  # the step's groups and the first refill are resampled
    plans = t.planner.plans(1)
    asyncio.run(engine.run_phase(plans))
    extra = asyncio.run(t._refill(engine, log, t.slots[0], plans))
    assert [len(p) for p in engine.played] == [8, 8, 8]
    assert len(extra) == 16 and all(log.routes[(p.group_id, "policy")] == "keep" for p in engine.played[-1])


def test_refill_rounds_are_bounded():
    t = trainer({"group_size": "4", "routing": "rlvr"})
    t.planner.batch = 4
    log = Log()
    engine = FakeEngine(log, resample_rounds=10 ** 6)  # every group is resampled, forever
    plans = t.planner.plans(1)
    asyncio.run(engine.run_phase(plans))
    asyncio.run(t._refill(engine, log, t.slots[0], plans))
    assert len(engine.played) == 1 + tr.MAX_REFILL_ROUNDS


def test_a_resampled_group_is_not_trained_on():
    roll = {"role": "p", "turn_index": 0, "sample_key": None, "prompt_ids": [1], "completion_ids": [2], "logprobs": [-0.1],
            "temperature": 1.0, "finish_reason": "stop"}
    s = SessionRecord("s1", "g1", 1, "ok", {}, {}, [("p", None, "verifier", 1.0)], [roll])
    batch = build_batch("p", [s], {("g1", "p"): "resample"})
    assert batch.trajectories == [] and batch.excluded["resampled_groups"] == 1


def test_resample_is_a_route_action_without_a_name():
    ok = compile_source("x.ask", 'experiment x {}\nmodel m = hf("smollm2-135m-instruct")\nrole p { model = m; trained; prompt = "hi" }\n'
                        'game g times 1 sample 4 { a = ask p\n reward p = 1\n route p { when var(rewards) > 0 -> keep; else -> resample } }\n')
    assert ok.ok
    bad = compile_source("x.ask", 'experiment x {}\nmodel m = hf("smollm2-135m-instruct")\nrole p { model = m; trained; prompt = "hi" }\n'
                         'game g times 1 sample 4 { a = ask p\n reward p = 1\n route p { else -> resample arena } }\n')
    assert not bad.ok and any(d.code == "E107" for d in bad.sink.items)
