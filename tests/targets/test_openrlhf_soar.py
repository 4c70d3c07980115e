"""SOAR (specs/soar.ask) as an OpenRLHF job, its generated agent loaded and driven by
OpenRLHF 0.11.2's own code (`_load_agent_executor`, `RolloutRayActor.generate_responses`
with num_samples = K x N) and a scripted llm_engine: an outer session is one prompt whose
K x N rollouts are the teacher's `sample N ask` replies of its K datasets.

- intrinsic_t: each rollout's reward and action range equal what `askspec run --backend
  replay` gives the same replies (the learnability reward is the game's own).
- grounded: the session's datasets go to the inner-loop service, exactly the datasets the
  local schedule reads from the replay run's sessions (nested.datasets_of), and every
  reply of dataset k returns that dataset's R_k. With a scripted service the R_k differ
  per dataset; with the real one (InnerLoopHost in process: `InProcessService`; it
  returns the local schedule's R_k under Ray in test_openrlhf_inner_loop.py) a tiny
  student (the random Llama of tests/conftest.py, 4 new tokens, inner batches of 2
  sessions: the sizes are the test's, the code the job's) is trained, its promotions
  land in the service's run store and the promoted student where driver.sh takes it.
- a generate call that raises ends the session's group: every rollout returns, no loss,
  and the service is not asked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_file
from askspec.runtime.commands.run import run_spec
from askspec.runtime.scoring.trajectory import trajectory_return
from askspec.runtime.store.views import open_store
from askspec.runtime.targets.openrlhf.generate import compile_job
from askspec.runtime.train.batch import SessionRecord
from askspec.runtime.train.nested import datasets_of

from openrlhf_harness import FakeEngine, FakeSamplingParams, InProcessService, generate_responses, load_agent_executor
from test_openrlhf_agent import Failing, replay_frozen_roles

SPEC = Path(__file__).resolve().parents[2] / "specs" / "soar.ask"
DATASETS, SIZE = 2, 2  # K datasets of N questions: K x N rollouts per prompt
SMALL = {"datasets": str(DATASETS), "dataset_size": str(SIZE), "student_samples": "2", "reward_questions": "2",
         "outer_steps": "2", "format_retries": "0", "copies": "1", "inner_steps": "1", "extra_inner_steps": "0",
         "promotion_threshold": "-1.0"}


def qa(question: str, answer: str) -> str:
    return f"Here is one. <question>{question}</question><answer>\\boxed{{{answer}}}</answer>"


# per outer session: the teacher's K x N replies (dataset-major), one of them malformed (dropped)
TEACHER = [[qa("What is 2+3?", "5"), qa("What is 7*6?", "42"), "no tags at all", qa("What is 9-4?", "5")],
           [qa("What is 10/2?", "5"), qa("What is 3^2?", "9"), qa("What is 8+8?", "16"), qa("What is 1+1?", "2")]]


def make_job(out: Path, profile: str) -> tuple[Path, object]:
    res = compile_file(str(SPEC), dict(SMALL), profile=profile)
    assert res.ok
    assert compile_job(res, str(SPEC), str(out), {}) == 0
    job = json.loads((out / "job.json").read_text())
    assert (job["siblings"], job["sample_calls"]) == ({"teach": DATASETS * SIZE}, {"teach": DATASETS})
    return out, res.ir


def replay_run(tmp_path: Path, profile: str, sessions: list[dict]) -> str:
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": sessions}))
    sets = [f"{k}={v}" for k, v in SMALL.items()]
    rc, run_dir = asyncio.run(run_spec(str(SPEC), out=str(tmp_path / "runs"), replay=str(recording), eval_only=True,
                                       set=sets, profile=profile, sessions=2, concurrency=1, quiet=True))
    assert rc == 0 and run_dir is not None
    return run_dir


def teacher_turns(con, sid: str) -> list[int]:
    return [t for (t,) in con.execute("select turn_index from turns where session_id = ? and role = 'teacher' "
                                      "order by turn_index", [sid]).fetchall()]


async def drive(executor, engine, job: Path, episodes: int = 2) -> list[dict]:
    """The job's episodes over its one prompt (`teach times outer_steps`: outer steps 1, 2, ...)
    through OpenRLHF's generate_responses; the agent closed after them."""
    from askspec.runtime.backends.registry import aclose_backends

    (line,) = [json.loads(x) for x in (job / "prompts.jsonl").read_text().splitlines()]
    out = []
    for _ in range(episodes):
        out += await generate_responses(engine, line["prompt"], line["label"], FakeSamplingParams(logprobs=1), 8192,
                                        engine.tokenizer, DATASETS * SIZE)
    await aclose_backends()
    executor.agent.close()
    return out


def check_ranges(responses: list[dict], engine: FakeEngine, dropped: set[int]) -> None:
    """Rollout m is reply m of the scripted calls: its range is exactly that reply, none when dropped."""
    for m, r in enumerate(responses):
        ids = engine.calls[m]["ids"]
        assert r["observation_tokens"][-len(ids):] == ids
        if m in dropped:
            assert r["action_ranges"] == []
        else:
            (start, end), = r["action_ranges"]
            assert r["observation_tokens"][start:end] == ids and end == len(r["observation_tokens"])


def test_intrinsic_t_rewards_match_replay(tmp_path, tiny_model, monkeypatch):
    sessions = [{"teacher": TEACHER[k], "student": ["\\boxed{5}", "\\boxed{4}", "\\boxed{42}", "\\boxed{42}",
                                                   "\\boxed{5}", "\\boxed{5}", "\\boxed{5}", "\\boxed{1}"],
                 "student_greedy": ["\\boxed{294}", "\\boxed{0}"]} for k in range(2)]
    run_dir = replay_run(tmp_path, "intrinsic_t", sessions)
    con = open_store(run_dir)
    expected = []
    for k in range(2):
        sid = f"s{k:06d}"
        rows = con.execute("select role, turn_index, name, value from rewards where session_id = ?", [sid]).fetchall()
        turns = teacher_turns(con, sid)
        assert len(turns) == DATASETS * SIZE
        expected += [trajectory_return(rows, "teacher", [t]) for t in turns]
    assert expected[2] is None and None not in expected[:2] + expected[3:]  # the malformed reply has no reward

    job, _ = make_job(tmp_path / "job", "intrinsic_t")
    data = json.loads((job / "job.json").read_text())
    assert "inner_loop" not in data  # no service: the reward is the game's
    assert sorted(data["endpoints"]["models"]) == ["student_greedy_model", "student_model"]  # frozen, never trained
    replay_frozen_roles(job, tmp_path / "replies.json")
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    executor = load_agent_executor(job / "agent.py")
    replies = iter([r for s in TEACHER for r in s])
    engine = FakeEngine(executor, _tokenizer(tiny_model), lambda prompt: next(replies))
    responses = asyncio.run(asyncio.wait_for(drive(executor, engine, job), 120))
    assert [r["reward"] for r in responses] == pytest.approx([0.0 if e is None else e for e in expected], abs=1e-12)
    check_ranges(responses, engine, {2})


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def tiny_soar(exp, tiny_model: Path):
    """soar.ask's IR with the tiny random Llama as both models (4 new tokens) and the
    student's inner RLOO steps at 2 sessions (group 2): what the inner-loop service runs."""
    exp = exp.model_copy(deep=True)
    for m in exp.models:
        if m.backend == "hf":
            m.weights = str(tiny_model)
            m.sampling["max_tokens"] = 4
    for t in exp.training:
        if t.role == "student":
            t.given = sorted({*t.given, "group", "batch"})
            assert t.config is not None
            t.config = t.config.model_copy(update={"group": 2, "batch": 2})
    return exp


def expected_datasets(con, sid: str) -> list[list[dict]]:
    """The datasets of a replay session as the local schedule reads them (nested.datasets_of):
    the teacher's replies, call by call (K calls of N, in turn order), less the dropped."""
    rows = con.execute("select turn_index, text, parsed from turns where session_id = ? and role = 'teacher' "
                       "order by turn_index", [sid]).fetchall()
    (book,) = con.execute("select bookkeeping from sessions where session_id = ?", [sid]).fetchone()
    book = json.loads(book) if isinstance(book, str) else (book or {})
    record = SessionRecord(sid, None, status="ok", book=book)
    parsed = {}
    for j, (turn, text, fields) in enumerate(rows):
        record.rollouts.append({"role": "teacher", "turn_index": turn, "sample_key": f"x{j // SIZE}.{j % SIZE}"})
        fields = json.loads(fields) if isinstance(fields, str) else fields
        if isinstance(fields, dict):
            parsed[(sid, turn)] = {"text": text, **fields}
    return [d.items for d in datasets_of([record], parsed, "teacher")]


class ScriptedService:
    """The inner-loop service as a test double: R_k = 0.25 k - 0.5 for dataset k of every
    call (distinct per dataset), the calls kept."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    async def answer(self, key: str, datasets: list[list[dict]]) -> dict:
        self.calls.append({"key": key, "datasets": datasets})
        return {"outer_rewards": [0.25 * k - 0.5 for k in range(1, len(datasets) + 1)]}


def grounded_job(tmp_path: Path, monkeypatch) -> tuple[Path, object, list[list[list[dict]]]]:
    """The grounded job, and the datasets of the replay run's two outer sessions as the
    local schedule reads them."""
    run_dir = replay_run(tmp_path, "grounded", [{"teacher": TEACHER[k]} for k in range(2)])
    con = open_store(run_dir)
    wanted = [expected_datasets(con, f"s{k:06d}") for k in range(2)]
    assert [len(d) for d in wanted[0]] == [2, 1] and [len(d) for d in wanted[1]] == [2, 2]
    job, exp = make_job(tmp_path / "job", "grounded")
    data = json.loads((job / "job.json").read_text())
    assert data["inner_loop"]["games"] == ["teach"]
    # the student is asked only under `if teacher_reward == "intrinsic"`: no frozen server for it
    assert data["endpoints"] == {"roles": {}, "models": {}}
    assert "python3 -m askspec_nested" in (job / "README.md").read_text()  # the README says how the service starts
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    return job, exp, wanted


def test_grounded_rollouts_get_their_datasets_r_k(tmp_path, tiny_model, monkeypatch):
    """Each outer session's datasets reach the service once, as the local schedule reads
    them from the same replies; every reply of dataset k returns the R_k the service gave
    (the dropped one too, with no action range), recorded as the turn reward `grounded`."""
    job, _, wanted = grounded_job(tmp_path, monkeypatch)
    executor = load_agent_executor(job / "agent.py")
    executor.agent.service = service = ScriptedService()
    replies = iter([r for s in TEACHER for r in s])
    engine = FakeEngine(executor, _tokenizer(tiny_model), lambda prompt: next(replies))
    responses = asyncio.run(asyncio.wait_for(drive(executor, engine, job), 120))
    assert [c["datasets"] for c in service.calls] == wanted
    assert len({c["key"] for c in service.calls}) == 2  # one outer step per session
    assert [r["reward"] for r in responses] == [-0.25, -0.25, 0.0, 0.0] * 2
    check_ranges(responses, engine, {2})
    agent_run = next((tmp_path / "agent-runs").iterdir())
    rows = open_store(str(agent_run)).execute("select session_id, turn_index, value from rewards where role = 'teacher' "
                                              "and name = 'grounded' order by session_id, turn_index").fetchall()
    assert [v for _, _, v in rows] == [-0.25, -0.25, 0.0, 0.0] * 2


@pytest.mark.slow  # the inner loop itself: a tiny student's copies trained and graded, 2 outer steps (~8 s)
def test_grounded_job_with_the_inner_loop_service(tmp_path, tiny_model, monkeypatch):
    """The agent with the real service (InnerLoopHost in process; under Ray with the local
    schedule's R_k in test_openrlhf_inner_loop.py): rewards are the R_k its run store
    records per dataset, its promotions land there, and the promoted student is written
    where driver.sh takes it for the stages."""
    from askspec.runtime.commands.resolver import local_resolver
    from askspec.runtime.targets.openrlhf.inner_loop import InnerLoopHost

    job, exp, wanted = grounded_job(tmp_path, monkeypatch)
    host = InnerLoopHost(tiny_soar(exp, tiny_model).model_dump_json(), spec_dir=str(job / "spec"), seed=0,
                         runs=str(tmp_path / "service-runs"), state_dir=str(tmp_path / "service"),
                         resolver_factory=local_resolver)
    executor = load_agent_executor(job / "agent.py")
    executor.agent.service = InProcessService(host)
    replies = iter([r for s in TEACHER for r in s])
    engine = FakeEngine(executor, _tokenizer(tiny_model), lambda prompt: next(replies))
    responses = asyncio.run(asyncio.wait_for(drive(executor, engine, job), 120))
    host.close()
    assert [c["datasets"] for c in executor.agent.service.calls] == wanted
    run = next(p for p in (tmp_path / "service-runs").iterdir() if p.is_dir())
    con = open_store(str(run))
    r_k = con.execute("select step, dataset, value from nested_events where event = 'dataset' order by seq").fetchall()
    assert [(step, k) for step, k, _ in r_k] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert [r["reward"] for r in responses] == pytest.approx([v for _, _, v in r_k for _ in range(SIZE)], abs=1e-12)
    assert all(r["extra_logs"]["askspec_inner_loop_ok"] == 1.0 for r in responses)
    check_ranges(responses, engine, {2})
    events = con.execute("select step, event from nested_events where event in ('decision', 'promotion') "
                         "order by seq").fetchall()
    assert events == [(1, "decision"), (1, "promotion"), (2, "decision"), (2, "promotion")]  # threshold -1
    assert (tmp_path / "service" / "promoted" / "config.json").exists()


def test_a_teacher_call_that_raises_ends_its_group(tmp_path, tiny_model, monkeypatch):
    job, _ = make_job(tmp_path / "job", "grounded")
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    executor = load_agent_executor(job / "agent.py")

    class Unreachable:
        async def answer(self, key, datasets):
            raise AssertionError("a failed session must not reach the inner loop")

    executor.agent.service = Unreachable()
    engine = FakeEngine(executor, _tokenizer(tiny_model), Failing(TEACHER[0], fail=1))
    responses = asyncio.run(asyncio.wait_for(drive(executor, engine, job, episodes=1), 60))
    assert [(r["reward"], r["action_ranges"], r["extra_logs"]["askspec_inner_loop_ok"]) for r in responses] == \
        [(0.0, [], 0.0)] * (DATASETS * SIZE)
    run = next((tmp_path / "agent-runs").iterdir())
    (status, error), = open_store(str(run)).execute("select status, error from sessions").fetchall()
    assert status == "error" and "the engine actor died" in error


class BrokenService:
    """The inner-loop service as a test double that raises, or never answers."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang

    async def answer(self, key: str, datasets: list[list[dict]]) -> dict:
        if self.hang:
            await asyncio.Event().wait()
        raise RuntimeError("the inner-loop actor died")


@pytest.mark.parametrize("hang", [False, True], ids=["raises", "hangs"])
def test_a_failed_inner_loop_leaves_the_session_without_loss(tmp_path, tiny_model, monkeypatch, hang):
    """A service that raises, or that does not answer within $ASKSPEC_INNER_TIMEOUT: every
    rollout of the session returns, with no reward and no loss."""
    job, _ = make_job(tmp_path / "job", "grounded")
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    monkeypatch.setenv("ASKSPEC_INNER_TIMEOUT", "0.5")
    executor = load_agent_executor(job / "agent.py")
    executor.agent.service = BrokenService(hang)
    replies = iter(TEACHER[0])
    engine = FakeEngine(executor, _tokenizer(tiny_model), lambda prompt: next(replies))
    responses = asyncio.run(asyncio.wait_for(drive(executor, engine, job, episodes=1), 60))
    assert [(r["reward"], r["action_ranges"], r["extra_logs"]["askspec_inner_loop_ok"]) for r in responses] == \
        [(0.0, [], 0.0)] * (DATASETS * SIZE)
