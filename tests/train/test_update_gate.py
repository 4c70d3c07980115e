"""The update gate (`update_when`, issue 11 item 2; in an alternating schedule, #24):
evaluated over each step's sessions in metric scope; a closed gate skips the role's update
and the skip is recorded in `train_steps` (`skipped = 'gate'`, `metrics.skip_reason`,
`metrics.gate`).

The trainer's loop is the thing under test; the engine, the policy and the run writer
around it are python fakes defined here (FakeEngine, FakePolicy, FakeWriter), so no
model is loaded."""

from __future__ import annotations

import asyncio
from pathlib import Path

from askspec.lang.compiler import compile_file
from askspec.runtime.train.trainer import LocalTrainer
from askspec.runtime.train.steplog import StepLog

SPEC = """
model m = hf("smollm2-135m-instruct") { max_tokens = 8 }
role solver { model = m; trained; memory = none }
data qs = [{q: "1+1"}, {q: "2+2"}]
game g for item in qs {
    a = ask solver: item.q
    valid = len(a.text) > 3
    reward solver = 1.0
}
train solver with grpo { steps = 3; save_every = 100; update_when = sum(valid) > 0 }
"""


class FakeWriter:
    """Stands in for the run writer: keeps the train_steps events."""

    run_id, generation = "r", 0

    def __init__(self) -> None:
        self.steps: list[tuple[str, int, dict]] = []

    def session_started(self, session_id, **kw) -> int:
        return 1

    def session_finished(self, *a, **kw) -> None:
        pass

    def train_step(self, role, step, metrics) -> None:
        self.steps.append((role, step, metrics))

    def flush(self) -> None:
        pass


class FakeEngine:
    """Plays a step by recording each session as finished with `valid` = whether the
    step is in `valid_steps` (what the gate reads)."""

    buffers: dict = {}

    def __init__(self, log: StepLog, valid_steps: set[int]) -> None:
        self.log, self.valid_steps = log, valid_steps

    def enter_step(self, step, phase) -> None:
        pass

    async def run_phase(self, plans, replay_ids) -> None:
        for p in plans:
            attempt = self.log.session_started(p.session_id, game=p.game, group_id=p.group_id, params={}, index=p.index)
            self.log.session_finished(p.session_id, attempt, status="ok", outcome=None, error=None,
                                      vars={"valid": p.step in self.valid_steps})


class FakePolicy:
    """Counts updates instead of training."""

    version = 0

    def __init__(self) -> None:
        self.updates = 0

    def update(self, trajectories) -> dict:
        self.updates += 1
        self.version += 1
        return {"loss": 0.0, "trajectories": len(trajectories), "tokens": 0}

    def save(self, folder: Path, step: int, metrics: dict) -> None:
        folder.mkdir(parents=True, exist_ok=True)

    def finite(self) -> bool:  # checked before each checkpoint
        return True


def test_the_gate_skips_the_step_without_a_valid_session_and_updates_the_others(tmp_path):
    spec = tmp_path / "gate.ask"
    spec.write_text(SPEC)
    res = compile_file(str(spec), {})
    assert res.ok, res.diagnostics
    exp = res.ir
    assert exp.training[0].update_when is not None
    trainer = LocalTrainer(exp, params=exp.param_values(), datasets={"qs": [{"q": "1+1"}, {"q": "2+2"}]}, seed=0,
                           resolver=None, run_dir=tmp_path / "run")
    policy = FakePolicy()
    trainer.policies["solver"] = policy
    writer = FakeWriter()
    log = StepLog(writer)
    asyncio.run(trainer.run(FakeEngine(log, valid_steps={1, 3}), log))
    by_step = {step: m for _, step, m in writer.steps}
    assert sorted(by_step) == [1, 2, 3]
    assert by_step[2]["gate"] is False and by_step[2]["skipped"] == "gate"
    assert by_step[2]["skip_reason"].startswith("update_when was false")
    assert "skipped" not in by_step[1] and "skipped" not in by_step[3]
    assert policy.updates == 2  # steps 1 and 3


def test_a_gate_over_no_finished_session_skips(tmp_path):
    spec = tmp_path / "gate.ask"
    spec.write_text(SPEC)
    exp = compile_file(str(spec), {}).ir
    trainer = LocalTrainer(exp, params={}, datasets={"qs": [{"q": "1+1"}]}, seed=0, resolver=None, run_dir=tmp_path)
    plans = trainer.planner.plans(1)
    from askspec.runtime.train.update import gate_reason

    assert gate_reason(exp, trainer.gates["solver"], plans, []) is not None  # sum of nothing is 0: not > 0


ALTERNATING = """
model m = hf("smollm2-135m-instruct") { max_tokens = 8 }
role proposer { model = m; trained; memory = none }
role solver { model = m; trained; memory = none }
data passages = [{k: "a"}, {k: "b"}, {k: "c"}]
buffer questions { capacity = 10; fields = {q: string} }
game propose for passage in passages {
    x = ask proposer: passage.k
    pushed = 0
    reward proposer = 1.0
}
game practice for q in questions {
    s = ask solver: q.q
    reward solver = 1.0
}
train proposer with grpo { save_every = 100; update_when = sum(pushed) > 0 }
train solver with grpo { save_every = 100 }
schedule alternating { proposer = 3; solver = 1; iterations = 1; games = {proposer: propose, solver: practice} }
"""


class PushingEngine(FakeEngine):
    """A proposer session 'pushes' a question (pushed = 1) only in `valid_steps`; the
    buffer stays empty (the solver's phase has nothing to replay)."""

    def __init__(self, log: StepLog, valid_steps: set[int]) -> None:
        from askspec.runtime.scoring.buffers import ReplayBuffer

        super().__init__(log, valid_steps)
        self.buffers = {"questions": ReplayBuffer("questions", 10)}

    async def run_phase(self, plans, replay_ids) -> None:
        for p in plans:
            attempt = self.log.session_started(p.session_id, game=p.game, group_id=p.group_id, params={}, index=p.index)
            self.log.session_finished(p.session_id, attempt, status="ok", outcome=None, error=None,
                                      vars={"pushed": int(p.step in self.valid_steps)})


def test_the_gate_holds_in_an_alternating_schedules_proposer_phase(tmp_path):
    """PasoDoble offline (Algorithm 2 l.24-28): a proposer step whose sessions buffered no
    question is not an update; the other proposer steps are."""
    spec = tmp_path / "alt.ask"
    spec.write_text(ALTERNATING)
    res = compile_file(str(spec), {})
    assert res.ok, [d.message for d in res.sink.sorted()]
    exp = res.ir
    trainer = LocalTrainer(exp, params=exp.param_values(), datasets={"passages": [{"k": "a"}, {"k": "b"}, {"k": "c"}]},
                           seed=0, resolver=None, run_dir=tmp_path / "run")
    proposer, solver = FakePolicy(), FakePolicy()
    trainer.policies.update(proposer=proposer, solver=solver)
    writer = FakeWriter()
    log = StepLog(writer)
    asyncio.run(trainer.run(PushingEngine(log, valid_steps={1, 3}), log))
    steps = {(role, step): m for role, step, m in writer.steps}
    assert steps[("proposer", 2)]["skipped"] == "gate" and "skipped" not in steps[("proposer", 1)]
    assert "skipped" not in steps[("proposer", 3)] and proposer.updates == 2
    assert steps[("solver", 4)]["skipped"] == "empty_buffer" and solver.updates == 0
