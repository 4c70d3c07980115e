"""One step's advantages, job against local trainer: the rollouts the generated agent
returns (driven by OpenRLHF 0.11.2's own generate_responses), made Experiences by its own
`_process_response_into_experience` and given advantages by its own
`compute_advantages_and_returns` with the job's askspec_ext installed, equal the local
trainer's advantages (runtime/train/batch.py's build_batch on the same sessions, then
policy.update's estimator call) to 1e-6: a dropped member is left out of its group
([1, 0.5, 0.25-dropped] gives [0.707, −0.707, excluded]), for both stds."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from askspec.runtime.targets.openrlhf import adapter
from askspec.runtime.train.advantages import advantages as local_advantages
from askspec.runtime.train.batch import build_batch
from askspec.runtime.train.policy import _rewards_and_groups
from askspec.runtime.train.steplog import StepLog

from openrlhf_harness import parse_train_ppo_ray, launch_argv, train_flags
from openrlhf_modules import experience_maker, experience_module, samples_generator
from test_openrlhf_agent import drive, make_job, tokenizer  # noqa: F401  (the module's fixture)
from test_openrlhf_population_std import maker

SPEC = Path(__file__).parent / "specs" / "equivalence.ask"
pytestmark = pytest.mark.slow


def agent_step(tmp: Path, tokenizer, monkeypatch, std: str):
    """(job, responses, the local trainer's view of the same sessions: a StepLog)."""
    job = make_job(SPEC, tmp / "job", {} if std == "sample" else {})
    if std == "population":
        data = json.loads((job / "job.json").read_text())
        data["extension"]["advantages"]["std"] = "population"
        (job / "job.json").write_text(json.dumps(data))
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp / "agent-runs"))
    logs: list[StepLog] = []
    opened = adapter.GameAgent._open_writer

    def open_writer(self):
        writer = opened(self)
        logs.append(StepLog(writer))
        logs[-1].close = writer.close  # the agent closes its writer when the rollouts are done
        return logs[-1]

    rollout = adapter._Recorder.rollout

    def record_rollout(self, plan, attempt, turn_index, role, result, temperature, sample_key):
        rollout(self, plan, attempt, turn_index, role, result, temperature, sample_key)
        # the agent's backend keeps the tokens in its Conversation: the trainer's rows need only
        # a completion here (grpo's advantages do not weigh tokens)
        row = SimpleNamespace(prompt_ids=[], completion_ids=list(result.completion_ids or [0]), logprobs=[],
                              finish_reason="stop")
        self.writer.rollout(plan, attempt, turn_index, role, row, temperature, sample_key)

    monkeypatch.setattr(adapter.GameAgent, "_open_writer", open_writer)
    monkeypatch.setattr(adapter._Recorder, "rollout", record_rollout)
    replies = ["a good text", "so-so", "skip this", "good", "fair", "so-so"]
    responses, _ = asyncio.run(drive(job, tokenizer, elements=2, group=3, replies=replies))
    (log,) = logs
    return job, responses, log


def local_step(log: StepLog, std: str) -> dict[str, float]:
    """The local trainer's advantage per session (policy.update's call on build_batch's trajectories)."""
    batch = build_batch("writer", list(log.sessions.values()), log.routes)
    rewards, groups = _rewards_and_groups(batch.trajectories)
    counts = torch.tensor([t.tokens for t in batch.trajectories], dtype=torch.float64)
    adv = local_advantages("grpo", rewards, groups, counts, std)
    return {t.key.split("/")[0]: float(a) for t, a in zip(batch.trajectories, adv)}


def job_step(job: Path, responses: list[dict], tmp: Path, monkeypatch, job_module) -> dict[int, float]:
    register = lambda name, module: monkeypatch.setitem(sys.modules, name, module)  # noqa: E731
    module, exp_module, gen = experience_maker(register), experience_module(register), samples_generator(register)
    (call,) = launch_argv(job / "launch.sh", tmp)
    args = parse_train_ppo_ray(train_flags(call))
    if (job / "askspec_ext").is_dir():  # (a job compiled before every RL job shipped the hook has none)
        job_module(job, "advantages").install(module)
    process = gen.SamplesGenerator._process_response_into_experience
    samples = [process(object.__new__(gen.SamplesGenerator), r, max_len=4096) for r in responses]
    for i, s in enumerate(samples):
        s.index = [i]
        s.kl = torch.zeros_like(s.action_mask, dtype=torch.float32)
    batches = [exp_module.Experience.concat_experiences(samples[i:i + 2], 0) for i in range(0, len(samples), 2)]
    out = {}
    for e in maker(module, args).compute_advantages_and_returns(batches):
        for row, i in enumerate(e.index):
            values = e.advantages[row][e.action_mask[row].bool()]
            out[i] = float(values[0]) if values.numel() else None
    return out


@pytest.mark.parametrize("std", ["sample", "population"])
def test_job_advantages_are_the_local_trainers(tmp_path, tokenizer, monkeypatch, job_module, std) -> None:  # noqa: F811
    job, responses, log = agent_step(tmp_path, tokenizer, monkeypatch, std)
    assert [r["reward"] for r in responses] == pytest.approx([1.0, 0.5, 0.25, 1.0, 0.5, 0.5])  # the dropped one keeps its reward
    local = local_step(log, std)
    got = job_step(job, responses, tmp_path, monkeypatch, job_module)
    sessions = sorted(log.sessions)
    assert len(sessions) == len(responses)
    for k, sid in enumerate(sessions):
        if sid in local:
            assert got[k] == pytest.approx(local[sid], abs=1e-6), (k, got, local)
        else:  # left out locally: no loss token in the job
            assert got[k] is None and responses[k]["action_ranges"] == []
    assert sessions[2] not in local  # the dropped member
    # [1, 0.5, 0.25-dropped]: the group is [1, 0.5] (OpenRLHF's own code took all three)
    want = 2 ** -0.5 if std == "sample" else 1.0
    assert [got[0], got[1]] == pytest.approx([want, -want], abs=1e-3)
    assert json.loads((job / "job.json").read_text())["extension"]["advantages"]["estimator"] == "grpo"
