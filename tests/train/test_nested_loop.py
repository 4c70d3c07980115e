"""The nested schedule's inner loop with scripted accuracies (no model is loaded): the
outer rewards, the moving-average decision, the promotion of the best dataset's median
copy, the promoted dataset kept, and the loop's state across a checkpoint. The inner
role is FakePolicy, a stand-in named as such: its weights are one number, a copy's id."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from askspec.lang.compiler import compile_file
from askspec.runtime.train.batch import SessionRecord
from askspec.runtime.train.nested import LoopState, datasets_of, decide, median_copy
from askspec.runtime.train.trainer import LocalTrainer

pytestmark = pytest.mark.slow  # (askspec processes, a Ray cluster or a real model)

SPEC = Path(__file__).parent / "specs" / "tiny_nested.ask"


class FakePolicy:
    """Stands in for TrainedPolicy: fork() makes a copy with a new id as its weights."""

    made = 0

    def __init__(self) -> None:
        FakePolicy.made += 1
        self.w = float(FakePolicy.made)
        self.forks: list[FakePolicy] = []
        self.released = False

    def fork(self) -> FakePolicy:
        self.forks.append(FakePolicy())
        return self.forks[-1]

    def state(self) -> dict:
        return {"w": torch.tensor([self.w])}

    def take_weights(self, state: dict) -> None:
        self.w = float(state["w"][0])

    async def release(self) -> None:
        self.released = True


class FakeLog:
    """Stands in for the trainer's StepLog: keeps what the loop writes."""

    def __init__(self) -> None:
        self.sessions: dict = {}
        self.routes: dict = {}
        self.parsed: dict = {}
        self.events: list[dict] = []
        self.rewards: list[tuple] = []

    def reset(self) -> None:
        self.sessions, self.routes, self.parsed = {}, {}, {}

    def nested_event(self, **ev) -> None:
        self.events.append(ev)

    def reward(self, session_id, attempt, *, role, turn_index, name, value, kind) -> None:
        self.rewards.append((session_id, role, turn_index, name, value))


def outer_session(log: FakeLog) -> list[SessionRecord]:
    """One teach session: 2 `sample 3 ask teacher` calls; reply 4 was dropped (malformed)."""
    s = SessionRecord("s000000", None, status="ok", book={"dropped": [{"role": "teacher", "turns": [4]}]})
    for t in range(6):
        s.rollouts.append({"role": "teacher", "turn_index": t, "sample_key": f"x{t // 3 + 1}.{t % 3}"})
        log.parsed[("s000000", t)] = {"text": f"question {t}", "answer": str(t), "parsed": t != 4}
    log.sessions = {"s000000": s}
    return [s]


@pytest.fixture
def loop(tmp_path):
    res = compile_file(str(SPEC), {"threshold": "0.15", "copies": "3", "extra": "1"})
    assert res.ok
    exp = res.ir
    t = LocalTrainer(exp, params=exp.param_values(), datasets={"hard": [{"question": f"{i}+1?", "answer": str(i + 1)}
                                                                         for i in range(4)]},
                     seed=0, resolver=None, run_dir=tmp_path)
    t.policies = {"teacher": FakePolicy(), "student": FakePolicy()}
    return t


def script(inner, accuracies: dict[str, float]) -> list[tuple]:
    """Replace playing games by scripted accuracies per copy ("base", "d1c2", ...)."""
    trained: list[tuple] = []

    async def accuracy(step, tag, questions, engine, log):
        assert len(questions) == 2  # reward_questions
        return accuracies[tag]

    async def inner_step(step, ds, j, i, copy, engine, log):
        trained.append((step, ds.k, j, i, copy.w))
        return {"loss": 0.0}

    inner._accuracy, inner._inner_step = accuracy, inner_step
    return trained


def test_promotion_keeps_the_median_copy_of_the_best_dataset(loop):
    inner = loop.inner
    student = loop.policies["student"]
    w0 = student.w
    # step 1: no copy improves on the baseline; the moving average 0 stays under 0.15
    log = FakeLog()
    script(inner, {"base": 0.2, **{f"d{k}c{j}": 0.2 for k in (1, 2) for j in (1, 2, 3)}})
    out = asyncio.run(inner.run(1, 0, None, log, outer_session(log)))
    assert out["promoted"] is False and student.w == w0
    # step 2: dataset 1's copies reach 0.9, 0.5, 1.0 (R_1 = 0.6), dataset 2's 0.4 (R_2 = 0.2);
    # the mean 0.4 averaged with step 1's 0 over the window of 2 is 0.2 > 0.15: promotion
    log = FakeLog()
    trained = script(inner, {"base": 0.2, "d1c1": 0.9, "d1c2": 0.5, "d1c3": 1.0, "d2c1": 0.4, "d2c2": 0.4,
                             "d2c3": 0.4})
    out = asyncio.run(inner.run(2, 0, None, log, outer_session(log)))
    assert out["outer_rewards"] == pytest.approx([0.6, 0.2])
    assert out["moving_average"] == pytest.approx(0.2) and out["promoted"] is True
    # every copy trained its 2 inner steps on its own weights; the median of dataset 1 is copy 1
    copy_weights = {(k, j): w for _, k, j, _, w in trained}
    assert len(trained) == 2 * 3 * 2 and len(set(copy_weights.values())) == 6
    assert student.w == copy_weights[(1, 1)]
    assert len(student.forks) == 12 and all(c.released for c in student.forks)  # no copy keeps serving
    (promotion,) = [e for e in log.events if e["event"] == "promotion"]
    assert (promotion["dataset"], promotion["copy"]) == (1, 1)
    # the promoted dataset is dataset 1's well-formed replies (the dropped reply 4 is not an item)
    assert [i["question"] for i in promotion["data"]["items"]] == ["question 0", "question 1", "question 2"]
    (decision,) = [e for e in log.events if e["event"] == "decision"]
    assert decision["value"] == pytest.approx(0.2) and decision["data"]["threshold"] == 0.15
    # each reply of a dataset gets its dataset's reward, dropped ones too (the trainer excludes them)
    assert sorted((t, round(v, 6)) for _, role, t, name, v in log.rewards if role == "teacher" and name == "grounded") == [
        (0, 0.6), (1, 0.6), (2, 0.6), (3, 0.2), (4, 0.2), (5, 0.2)]
    # no copy's weights are left on disk; the loop's state survives a checkpoint
    assert not (loop.run_dir / "checkpoints" / "nested" / "work").exists()
    inner.save(loop.run_dir / "checkpoints", 2)
    inner.state = LoopState()
    inner.restore(loop.run_dir / "checkpoints", 2)
    assert inner.state.rewards == pytest.approx([0.0, 0.4]) and [p["dataset"] for p in inner.state.promotions] == [1]
    # Alg. 1's one running average: a promotion does not reset it, so step 3 (no dataset
    # improves on the promoted baseline: mean 0) averages with step 2's 0.4 to 0.2 > 0.15
    log = FakeLog()
    script(inner, {"base": 0.5, **{f"d{k}c{j}": 0.5 for k in (1, 2) for j in (1, 2, 3)}})
    out = asyncio.run(inner.run(3, 0, None, log, outer_session(log)))
    assert out["moving_average"] == pytest.approx(0.2) and out["promoted"] is True


def test_after_a_promotion_the_inner_loop_is_longer(loop):
    inner = loop.inner
    inner.state.promotions.append({"step": 1, "dataset": 1, "copy": 1, "items": []})
    log = FakeLog()
    trained = script(inner, {"base": 0.0, **{f"d{k}c{j}": 0.0 for k in (1, 2) for j in (1, 2, 3)}})
    asyncio.run(inner.run(3, 0, None, log, outer_session(log)))
    assert {i for *_, i, _ in trained} == {1, 2, 3}  # inner_steps 2 + extra_inner_steps 1


def test_median_decision_and_datasets():
    assert median_copy([0.9, 0.5, 1.0]) == 0 and median_copy([0.3, 0.1]) == 1 and median_copy([0.2, 0.2]) == 0
    state = LoopState()
    assert decide(state, 0.0, 3, 0.01) == (0.0, False)
    assert decide(state, 0.09, 3, 0.01) == (pytest.approx(0.045), True)
    log = FakeLog()
    ds = datasets_of(outer_session(log), log.parsed, "teacher")
    assert [(d.k, len(d.items), len(d.turns)) for d in ds] == [(1, 3, 3), (2, 2, 3)]
