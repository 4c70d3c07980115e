"""`update_when` on OpenRLHF: the job's askspec_ext/gate.py hooks OpenRLHF 0.11.2's own
`BasePPOTrainer.train_step` (run on CPU, its Ray actor groups replaced by a tiny torch
model with AdamW, its rollouts made by its own `_process_response_into_experience`). A
step whose sessions close the gate takes no update — parameters and AdamW state stay
bit-identical, no experience is made — and is recorded as the local trainer records it
(`train_steps.skipped = 'gate'`); an open gate steps. The gate counts a session of
siblings once and an errored session not at all, and the hook refuses an OpenRLHF it was
not written for; the generated agent writes the sessions the gate reads (slow)."""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from askspec.cli import main
from askspec.runtime.backends.registry import aclose_backends
from askspec.runtime.store.views import open_store
from askspec.runtime.targets.openrlhf.update_gate import JobGate, labelled, session_fields

from openrlhf_harness import (FakeEngine, FakeSamplingParams, assert_pin_refusals, generate_responses, launch_argv,
                              load_agent_executor, parse_train_ppo_ray, smollm2_tokenizer, train_flags)
from openrlhf_modules import ppo_trainer, samples_generator

SPEC = """
model m = hf("smollm2-135m-instruct") { max_tokens = 32 }
role p { model = m; trained }
game g for x in [1, 2, 3, 4] sample 2 {
    valid = 0
    a = ask p using "Say {{ x }}."
    if len(a.text) > 3 {
        valid = 1
    }
    reward p = valid
}
train p with grpo { group = 2; batch = 4; update_when = sum(valid) >= 2 }
"""


@pytest.fixture
def job(tmp_path) -> Path:
    (tmp_path / "w.ask").write_text(SPEC)
    out = tmp_path / "job"
    assert main(["compile", str(tmp_path / "w.ask"), "--target", "openrlhf", "-o", str(out)]) == 0
    return out


@pytest.fixture
def ext(job_module):
    """`load(job)`: the job's askspec_ext.gate, imported from its folder."""
    return lambda job: job_module(job, "gate")


@pytest.fixture
def openrlhf(monkeypatch):
    """(OpenRLHF's ppo_trainer module, its samples_generator module), loaded on CPU."""
    register = lambda name, module: monkeypatch.setitem(sys.modules, name, module)  # noqa: E731
    return ppo_trainer(register), samples_generator(register)


def rollouts(generator, job: Path, sessions: list[tuple[str, str, int]]) -> list:
    """OpenRLHF's rollout samples (its own _process_response_into_experience) of agent
    responses whose labels carry (session id, status, valid), as the agent writes them."""
    line = json.loads((job / "prompts.jsonl").read_text().splitlines()[0])
    out = []
    for k, (sid, status, valid) in enumerate(sessions):
        label = labelled(line["label"], session_fields(f"run/{sid}", "g", status, None, {"valid": valid, "a": "..."},
                                                       {"x": 1}, {"p": float(valid)}, {"valid"}))
        response = {"prompt": line["prompt"], "label": label, "observation_tokens": [5, 6, 7, 8, 9, 10],
                    "action_ranges": [(3, 6)], "reward": float(valid) + 0.25 * k, "scores": float(valid),
                    "rollout_log_probs": None, "truncated": False, "extra_logs": {"askspec_session_ok": 1.0}}
        out.append(generator.SamplesGenerator._process_response_into_experience(None, response, max_len=64))
    return out


class TinyActors:
    """OpenRLHF's actor group as a test double: `append` fills its replay buffer and `fit`
    takes one AdamW step of a tiny torch model on it (loss from the advantages) and one
    step of its learning-rate scheduler, as the PolicyModelActor's fit does with DeepSpeed
    (`model.step()`: optimizer, then scheduler); Ray's `__ray_call__` runs a function on it."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(6, 1)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-2, weight_decay=0.1)
        self.actor_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optim, lambda k: 1.0 / (k + 1))
        self.buffer: list = []
        self.fits = 0

    def async_run_method_batch(self, method_name: str, experience: list) -> list:
        assert method_name == "append"
        self.buffer += experience
        return []

    def async_run_method(self, method_name: str, *args, **kw) -> list:
        if method_name == "__ray_call__":  # the function, on each actor (this one)
            fn, *rest = args
            return [fn(self, *rest)]
        assert method_name == "fit"
        self.fits += 1
        x = torch.cat([e.sequences.float() for e in self.buffer])[:, :6]
        adv = torch.cat([e.rewards for e in self.buffer])
        loss = -(adv * self.model(x).squeeze(-1)).mean()
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        self.actor_scheduler.step()
        self.buffer.clear()
        return [{"policy_loss": float(loss.detach()), "actor_grad_norm": 1.0,
                 "actor_lr": self.actor_scheduler.get_last_lr()[0]}]

    def snapshot(self):
        return copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optim.state_dict())


class Maker:
    """The experience maker as a test double (its forward passes are Ray calls): counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def make_experience_batch(self, samples):
        self.calls += 1
        return samples


def trainer(module, args, actors: TinyActors, maker: Maker):
    t = object.__new__(module.BasePPOTrainer)
    t.args, t.strategy = args, SimpleNamespace(args=args)
    t.experience_maker, t.actor_model_group, t.critic_model_group, t.vllm_engines = maker, actors, None, None
    t.tokenizer = SimpleNamespace(decode=lambda seq, skip_special_tokens=True: ["..."])
    t.kl_ctl = module.FixedKLController(0.0)
    return t


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_closed_gate_takes_no_update(job, ext, openrlhf, tmp_path, monkeypatch) -> None:
    module, generator = openrlhf
    assert json.loads((job / "job.json").read_text())["extension"] == {
        "advantages": {"estimator": "grpo", "std": "sample"}, "update_gate": True,
        "lr_schedule": {"steps": 1, "warmup": 0, "decay": "constant", "floor": 0.0}, "prompt_order": "sequential"}
    (call,) = launch_argv(job / "launch.sh", tmp_path)
    assert call[call.index("--") + 3] == "askspec_ext.train_ppo_ray"
    args = parse_train_ppo_ray(train_flags(call))  # OpenRLHF's own parser: no flag of ours
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "runs"))
    ext(job).install()
    actors, maker = TinyActors(), Maker()
    t = trainer(module, args, actors, maker)
    open_, closed = [("s1", "ok", 1), ("s1", "ok", 1), ("s2", "ok", 1), ("s2", "ok", 1)], \
                    [("s3", "ok", 1), ("s3", "ok", 1), ("s4", "ok", 0), ("s4", "ok", 0)]
    status, step = t.train_step(rollouts(generator, job, open_), 0)  # sum(valid) = 2: the update runs
    assert step == 1 and status["askspec/gate"] == 1.0 and actors.fits == 1 and maker.calls == 1
    before = actors.snapshot()
    assert before[1]["state"]  # AdamW has moments to keep
    status, step = t.train_step(rollouts(generator, job, closed), 1)  # sum(valid) = 1: gated
    assert step == 2 and status["askspec/gate"] == 0.0 and status["askspec/skipped"] == 1.0
    assert status["rollout/num_samples"] == 4.0  # OpenRLHF's own rollout statistics of the batch
    assert actors.fits == 1 and maker.calls == 1 and actors.buffer == []  # no forward, backward or AdamW step
    assert same(actors.snapshot(), before)  # weights and optimizer state bit-identical
    assert actors.actor_scheduler.last_epoch == 1  # a gated step counts in no schedule (docs/training.md)
    status, step = t.train_step(rollouts(generator, job, open_), 2)
    assert step == 3 and actors.fits == 2
    after = actors.snapshot()
    assert not same(after[0], before[0]) and after[1]["state"][0]["step"] == 2
    (run,) = [d for d in (tmp_path / "runs").iterdir() if (d / "manifest.json").exists()]
    rows = open_store(str(run)).execute(
        "SELECT role, step, skipped, metrics->>'gate', metrics->>'skip_reason', metrics->>'sessions', "
        "metrics->>'tokens' FROM train_steps ORDER BY step").fetchall()
    assert [r[:4] for r in rows] == [("p", 1, None, "true"), ("p", 2, "gate", "false"), ("p", 3, None, "true")]
    assert "update_when was false" in rows[1][4] and rows[1][5] == "2" and rows[1][6] == "0"
    # the gated step's reward_std is the block's std (grpo's default: sample), as the local trainer's
    from askspec.ir.advantages import group_std

    values = [float(r) for e in rollouts(generator, job, closed) for r in e.rewards.flatten().tolist()]
    (gated_std,) = open_store(str(run)).execute("SELECT reward_std FROM train_steps WHERE step = 2").fetchone()
    assert gated_std == pytest.approx(group_std(values, "sample"))
    assert gated_std != pytest.approx(group_std(values, "population"))


ALTERNATING = """
model m = hf("smollm2-135m-instruct") { max_tokens = 32 }
role p { model = m; trained }
role q { model = m; trained }
game g for x in [1, 2, 3, 4] sample 2 {
    valid = 1
    a = ask p using "Say {{ x }}."
    reward p = valid
}
game h for x in [1, 2, 3, 4] sample 2 {
    b = ask q using "Say {{ x }}."
    reward q = 1
}
train p with grpo { group = 2; batch = 2; update_when = min(step) >= 5 }
train q with grpo { group = 2; batch = 2 }
schedule alternating {
    p = 2
    q = 1
    iterations = 2
    games = {p: g, q: h}
}
"""


def test_a_phases_steps_are_numbered_as_the_local_schedule_numbers_them(tmp_path, ext, openrlhf,
                                                                         monkeypatch) -> None:
    """OpenRLHF counts each launch's steps from 0; the local alternating schedule numbers a
    role's steps in the whole run (p's are 1, 2 then 4, 5; q's 3 then 6). The launch's
    iteration (ASKSPEC_ITERATION, from driver.sh) gives the trainer the local number,
    which `update_when` reads as `step` and the trainer's store records."""
    module, generator = openrlhf
    (tmp_path / "alt.ask").write_text(ALTERNATING)
    job = tmp_path / "alt"
    assert main(["compile", str(tmp_path / "alt.ask"), "--target", "openrlhf", "-o", str(job)]) == 0
    phase = job / "phase-1-p"
    (call,) = launch_argv(phase / "launch.sh", tmp_path, env={"ASKSPEC_ITERATION": "2"})
    env = json.loads(next(a for a in call if a.startswith("--runtime-env-json=")).split("=", 1)[1])["env_vars"]
    assert env["ASKSPEC_ITERATION"] == "2"
    args = parse_train_ppo_ray(train_flags(call))
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("ASKSPEC_ITERATION", env["ASKSPEC_ITERATION"])  # (Ray's runtime env, in the trainer)
    gate = ext(phase)
    gate.install()
    actors, maker = TinyActors(), Maker()
    t = trainer(module, args, actors, maker)
    batch = [("s1", "ok", 1), ("s1", "ok", 1)]
    status, _ = t.train_step(rollouts(generator, phase, batch), 0)  # local step 4: gated
    assert status["askspec/gate"] == 0.0 and actors.fits == 0
    status, _ = t.train_step(rollouts(generator, phase, batch), 1)  # local step 5: it updates
    assert status["askspec/gate"] == 1.0 and actors.fits == 1
    (run,) = [d for d in (tmp_path / "runs").iterdir() if (d / "manifest.json").exists()]
    rows = open_store(str(run)).execute("SELECT step, skipped FROM train_steps ORDER BY step").fetchall()
    assert rows == [(4, "gate"), (5, None)]
    # a job outside the schedule's phases (a retrain stage's PPO job) counts its own steps
    stage_job = json.loads((phase / "job.json").read_text())
    del stage_job["extension"]["carry_state"]
    assert [gate.StepGate(stage_job).step(k) for k in (0, 1)] == [1, 2]


def test_siblings_count_once_and_errors_not_at_all(job) -> None:
    gate = JobGate(json.loads((job / "job.json").read_text()))

    def labels(sessions):
        return [labelled('{"game": "g", "element": 0, "bindings": {"x": 1}}',
                         session_fields(sid, "g", status, None, {"valid": 1}, {"x": 1}, {}, {"valid"}))
                for sid, status in sessions]

    # three rollouts of one session and an errored one: sum(valid) is 1, not 3 or 4
    sessions = gate.sessions(labels([("a", "ok"), ("a", "ok"), ("a", "ok"), ("b", "error")]))
    assert [s["id"] for s in sessions] == ["a", "b"]
    assert gate.closed(sessions, step=1) == "update_when was false over the step's sessions"
    assert gate.closed(gate.sessions(labels([("a", "ok"), ("c", "ok")])), step=1) is None
    with pytest.raises(Exception, match="askspec_session"):
        gate.sessions(['{"game": "g", "element": 0, "bindings": {}}'])


def test_refuses_another_openrlhf(job, ext, openrlhf, monkeypatch) -> None:
    module, _ = openrlhf
    assert_pin_refusals(ext(job), "def train_step(self, rollout_samples, global_step): ...", monkeypatch)
    assert getattr(module.BasePPOTrainer, "_askspec_gate", None) is None  # nothing was hooked


def test_worker_hook_waits_for_what_the_job_asks(job, ext, monkeypatch) -> None:
    """Ray runs askspec_ext.train_ppo_ray.install_when_loaded in every worker: a gated grpo
    job's waits for OpenRLHF's PPO trainer (the gate), its experience maker (askspec's
    advantages) and the DeepSpeed strategy (the prompts in order), not the loss module (it
    trains with no CISPO), importing nothing."""
    ext(job)
    entry = importlib.import_module("askspec_ext.train_ppo_ray")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the finders go with the test
    for name in ("openrlhf.models.loss", "openrlhf.trainer.ppo_trainer", "openrlhf.trainer.ppo_utils.experience_maker",
                 "openrlhf.utils.deepspeed.deepspeed"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    entry.install_when_loaded()
    entry.install_when_loaded()  # twice: still one finder each
    waiting = [f.module for f in sys.meta_path if type(f).__name__ == "_InstallAfterLoad"]
    assert sorted(waiting) == ["openrlhf.trainer.ppo_trainer", "openrlhf.trainer.ppo_utils.experience_maker",
                               "openrlhf.utils.deepspeed.deepspeed"]
    assert "openrlhf.trainer.ppo_trainer" not in sys.modules
    assert "openrlhf.trainer.ppo_utils.experience_maker" not in sys.modules


def refusal(ext, job: Path, monkeypatch) -> str:
    """What the job's entry point says under OpenRLHF 0.12.0 (before Ray starts)."""
    ext(job)
    entry = importlib.import_module("askspec_ext.train_ppo_ray")
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.12.0" if name == "openrlhf" else real(name))
    monkeypatch.setattr(entry.runpy, "run_module", lambda *a, **kw: pytest.fail("OpenRLHF was started"))
    with pytest.raises(entry.pinned.VersionMismatch) as info:
        entry.main()
    return str(info.value)


def test_a_gated_grpo_job_is_refused_for_its_advantages_not_for_cispo(job, ext, monkeypatch) -> None:
    """A gated grpo job under another OpenRLHF: the entry point refuses it naming the first
    hook it checks, askspec's advantages, and that hook's remedy, not CISPO's (which the job
    does not use, and whose `--substitute cispo=grpo` does not apply)."""
    message = refusal(ext, job, monkeypatch)
    assert message.startswith("askspec's advantages extension was written for OpenRLHF 0.11.2 (it hooks "
                              "RemoteExperienceMaker.compute_advantages_and_returns), but openrlhf 0.12.0 is installed")
    assert message.endswith("install openrlhf==0.11.2 on every node, or train with askspec's own trainer")
    assert "CISPO" not in message and "substitute" not in message and "std = sample" not in message


def test_a_gate_only_job_is_refused_for_the_gate_not_for_cispo(tmp_path, ext, monkeypatch) -> None:
    """A job whose only extension is the update gate (every askspec algorithm now ships
    askspec's advantages too, `ppo` included: job.json's `extension` is edited to the gate
    alone): under another OpenRLHF the entry point refuses it naming the gate's hook and its
    remedy, not the advantages' or CISPO's, before Ray starts."""
    (tmp_path / "ppo.ask").write_text(SPEC.replace("with grpo", "with ppo"))
    job = tmp_path / "ppo"
    assert main(["compile", str(tmp_path / "ppo.ask"), "--target", "openrlhf", "-o", str(job)]) == 0
    spec = json.loads((job / "job.json").read_text())
    assert spec["extension"] == {"advantages": {"estimator": "grpo", "std": "sample"}, "update_gate": True,
                                 "lr_schedule": {"steps": 1, "warmup": 0, "decay": "constant", "floor": 0.0}, "prompt_order": "sequential"}
    spec["extension"] = {"update_gate": True}
    (job / "job.json").write_text(json.dumps(spec))
    message = refusal(ext, job, monkeypatch)
    assert message.startswith("askspec's update-gate extension was written for OpenRLHF 0.11.2 (it hooks "
                              "BasePPOTrainer.train_step and _compute_rollout_stats), but openrlhf 0.12.0 is installed")
    assert message.endswith("train with askspec's own trainer")
    assert "CISPO" not in message and "substitute" not in message and "advantages" not in message


SIBLINGS = """
model m = hf("smollm2-135m-instruct") { max_tokens = 32 }
role p { model = m; trained; memory = none }
game g for x in [1, 2] {
    valid = 0
    qs = sample 2 ask p using "Say {{ x }}."
    for q in qs {
        if len(q.text) > 3 {
            valid = valid + 1
        }
        reward q as p = len(q.text) / 10
    }
}
train p with grpo { lr = 0.000001; update_when = sum(valid) > 0 }
"""


@pytest.mark.slow  # the SmolLM2 tokenizer
def test_agent_labels_carry_the_session_to_the_gate(tmp_path, openrlhf) -> None:
    """The generated agent, driven by OpenRLHF's own generate_responses (2 siblings of a
    `sample 2 ask` per prompt), writes each rollout's session into its label; OpenRLHF's
    own _process_response_into_experience carries it into the rollout samples, where the
    gate reads one session per prompt with the variables it names."""
    _, generator = openrlhf
    (tmp_path / "w.ask").write_text(SIBLINGS)
    job = tmp_path / "job"
    assert main(["compile", str(tmp_path / "w.ask"), "--target", "openrlhf", "-o", str(job)]) == 0
    replies = {"Say 1.": iter(["a long reply", "no"]), "Say 2.": iter(["no", "ok"])}
    tokenizer = smollm2_tokenizer()

    async def play():
        executor = load_agent_executor(job / "agent.py")
        engine = FakeEngine(executor, tokenizer, lambda prompt: next(next(v for k, v in replies.items() if k in prompt)))
        out = []
        for line in [json.loads(x) for x in (job / "prompts.jsonl").read_text().splitlines()]:
            out.append(await asyncio.wait_for(generate_responses(engine, line["prompt"], line["label"],
                                                                 FakeSamplingParams(), 1024, tokenizer, 2), 60))
        await aclose_backends()
        executor.agent.close()
        return out

    prompts = asyncio.run(play())
    gate = JobGate(json.loads((job / "job.json").read_text()))
    per_prompt = []
    for responses in prompts:
        samples = [generator.SamplesGenerator._process_response_into_experience(None, r, max_len=1024)
                   for r in responses]
        (session,) = gate.sessions(label for e in samples for label in e.labels)  # two rollouts, one session
        assert session["vars"] == {"valid": session["vars"]["valid"]} and session["bindings"] == {}  # what the gate names
        assert session["status"] == "ok" and session["game"] == "g"
        per_prompt.append(session)
    assert [s["vars"]["valid"] for s in per_prompt] == [1, 0]
    assert per_prompt[0]["rewards"]["p"] == pytest.approx((len("a long reply") + len("no")) / 10)
    assert gate.closed(per_prompt[1:], step=1) == "update_when was false over the step's sessions"
    assert gate.closed(per_prompt, step=1) is None
