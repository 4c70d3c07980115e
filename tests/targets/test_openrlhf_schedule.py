"""A role's learning rate on an OpenRLHF job is the local trainer's at every optimizer step,
across the phases of an alternating schedule (askspec_ext/schedule.py).

Each phase of a compiled job is one OpenRLHF launch: its flags (parsed by train_ppo_ray's
own parser) build the actor's scheduler with OpenRLHF 0.11.2's own code
(`DeepspeedStrategy._ds_init_train_model`'s scheduler factory over `max_steps`, as
`prepare_datasets` counts them from the phase's prompt data set), the role's carried
checkpoint restores the optimizer and scheduler states (askspec_ext/carry.py), and the job's
hook gives the scheduler askspec's multiplier. Stepped as DeepSpeed steps it (once per
optimizer step, `--train.max_epochs` per rollout batch), every rate equals the local
trainer's `lr * lr_factor(step)` over the role's whole schedule. Without the hook, OpenRLHF's
own schedule restarts its warm-up and cosine in every phase."""

from __future__ import annotations

import ast
import copy
import functools
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import get_scheduler

from askspec.cli import main
from askspec.lang.compiler import compile_file
from askspec.runtime.train.config import config_from_ir, lr_factor

from openrlhf_harness import OPENRLHF, launch_argv, parse_train_ppo_ray, train_flags

# two trained roles in turns: p warms up over 2 steps then decays to min_lr over its 9 steps
# (3 a phase, 3 iterations); s decays over its 6 with 2 optimizer steps (epochs) per step
SPEC = """
model m = hf("smollm2-135m-instruct") { max_tokens = 8 }
role p { model = m; trained }
role s { model = m; trained }
game gp for x in [1, 2, 3, 4] sample 2 {
    a = ask p using "Say {{ x }}."
    reward p = len(a.text)
}
game gs for x in [1, 2, 3, 4] sample 2 {
    a = ask s using "Say {{ x }}."
    reward s = len(a.text)
}
train p with grpo { batch = 2; lr = 0.01; warmup = 2; decay = cosine; min_lr = 0.001 }
train s with grpo { batch = 2; lr = 0.02; decay = cosine; epochs = 2 }
schedule alternating {
    p = 3
    s = 2
    iterations = 3
    games = {p: gp, s: gs}
}
"""


def _statements(rel: str, cls: str, method: str, first: str, last: str) -> str:
    """The source of OpenRLHF's statements of `cls.method` from the assignment to `first`
    through the one to `last`."""
    tree = ast.parse((OPENRLHF / rel).read_text(encoding="utf-8"))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == method)
    names = [s.targets[0].id if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) else None
             for s in fn.body]
    return ast.unparse(ast.Module(body=fn.body[names.index(first):names.index(last) + 1], type_ignores=[]))


# OpenRLHF's scheduler factory (DeepspeedStrategy._ds_init_train_model) and its step count
# (prepare_datasets: the prompts x samples / train batch x episodes x epochs)
FACTORY = _statements("utils/deepspeed/deepspeed.py", "DeepspeedStrategy", "_ds_init_train_model",
                      "scheduler_steps", "sched_factory")
MAX_STEPS = ast.unparse(next(
    n.value for n in ast.walk(ast.parse((OPENRLHF / "trainer/ppo_trainer.py").read_text(encoding="utf-8")))
    if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "max_steps"))


def openrlhf_scheduler(args, prompts: int, optimizer: torch.optim.Optimizer):
    """The actor's scheduler as OpenRLHF builds it for a launch with `args` over `prompts` prompts."""
    max_steps = eval(MAX_STEPS, {"prompts_dataset": range(prompts), "args": args})
    # the actor's cfg as PolicyModelActor.init_model_from_pretrained passes it
    cfg = {"lr_scheduler": args.actor.lr_scheduler, "lr_warmup_ratio": args.actor.lr_warmup_ratio,
           "min_lr_ratio": args.actor.min_lr_ratio, "scheduler_steps": max_steps}
    scope = {"cfg": cfg, "partial": functools.partial, "get_scheduler": get_scheduler, "math": math}
    exec(FACTORY, scope)
    return scope["sched_factory"](optimizer)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("schedule")
    (tmp / "turns.ask").write_text(SPEC)
    assert main(["compile", str(tmp / "turns.ask"), "--target", "openrlhf", "-o", str(tmp / "job")]) == 0
    return tmp / "turns.ask", tmp / "job"


def run_job(job: Path, tmp: Path, load, hooked: bool) -> dict[str, list[float]]:
    """Every optimizer step's learning rate per role, phase after phase over the iterations as
    driver.sh runs them, each role's optimizer and scheduler states carried to its next phase."""
    phases = sorted(job.glob("phase-*"))
    carried: dict[str, dict] = {}
    rates: dict[str, list[float]] = {}
    for _ in range(3):  # the schedule's iterations
        for phase in phases:
            (call,) = launch_argv(phase / "launch.sh", tmp)
            args = parse_train_ppo_ray(train_flags(call))
            role = json.loads((phase / "job.json").read_text())["trained_role"]
            prompts = sum(1 for line in (phase / "prompts.jsonl").read_text().splitlines() if line.strip())
            weight = torch.nn.Parameter(torch.zeros(2))
            optimizer = torch.optim.AdamW([weight], lr=args.actor.adam.lr)
            scheduler = openrlhf_scheduler(args, prompts, optimizer)
            if role in carried:  # strategy.load_ckpt: DeepSpeed's optimizer and scheduler states
                optimizer.load_state_dict(carried[role]["optimizer"])
                scheduler.load_state_dict(carried[role]["scheduler"])
            if hooked:
                ext = load(phase, "schedule")
                ext.apply(scheduler, json.loads((phase / "job.json").read_text())["extension"]["lr_schedule"],
                          ext.epochs_of(args))
            rollout_steps = prompts // args.rollout.batch_size * args.train.num_episodes
            for _step in range(rollout_steps * args.train.max_epochs):  # DeepSpeed's optimizer steps
                rates.setdefault(role, []).append(optimizer.param_groups[0]["lr"])
                weight.grad = torch.ones(2)
                optimizer.step()
                scheduler.step()
            carried[role] = {"optimizer": copy.deepcopy(optimizer.state_dict()),
                             "scheduler": copy.deepcopy(scheduler.state_dict())}
    return rates


def local_rates(spec: Path) -> dict[str, list[float]]:
    """The local trainer's rate at each optimizer step of each role (policy.update: the
    step's rate for every epoch of it)."""
    res = compile_file(str(spec), {})
    assert res.ok and res.ir is not None
    out = {}
    for t in res.ir.training:
        cfg = config_from_ir(t, res.ir)
        out[t.role] = [cfg.lr * lr_factor(cfg, k) for k in range(cfg.steps) for _ in range(cfg.epochs)]
    return out


def test_every_optimizer_step_has_the_local_rate_across_phases(job, tmp_path, job_module) -> None:
    spec, folder = job
    local = local_rates(spec)
    assert len(local["p"]) == 9 and len(local["s"]) == 6 * 2
    assert local["p"][0] == pytest.approx(0.005) and local["p"][-1] == pytest.approx(0.001)  # warm-up, floor
    got = run_job(folder, tmp_path, job_module, hooked=True)
    for role in ("p", "s"):
        assert got[role] == pytest.approx(local[role], rel=1e-9), role


def test_openrlhfs_own_schedule_restarts_in_every_phase(job, tmp_path, job_module) -> None:
    """What the hook fixes: OpenRLHF lays its warm-up and decay over each launch's steps."""
    spec, folder = job
    local = local_rates(spec)
    got = run_job(folder, tmp_path, job_module, hooked=False)
    assert got["p"] != pytest.approx(local["p"], rel=1e-6)
    # its first phase starts the warm-up at 0; its second starts at the floor where the local
    # decay has barely begun; and transformers' cosine, past its launch's steps, climbs back
    assert got["p"][:4] == pytest.approx([0.0, 0.005, 0.01, 0.001])
    assert local["p"][:4] == pytest.approx([0.005, 0.01, 0.01, 0.0094], abs=1e-5)
    assert got["s"][8] == pytest.approx(0.02) and local["s"][8] == pytest.approx(0.00191, abs=1e-5)


def test_a_skipped_step_moves_the_schedule_by_one_askspec_step(job, job_module) -> None:
    """A step skipped for want of a loss token counts in the schedule (gate.py's
    `step_lr_schedule`): with 2 epochs, the 2 scheduler steps of one askspec step, so the
    next step trains at the local rate of the step after it."""
    from types import SimpleNamespace

    _, folder = job
    phase = next(p for p in sorted(folder.glob("phase-*")) if "-s" in p.name)
    plan = json.loads((phase / "job.json").read_text())["extension"]["lr_schedule"]
    schedule, gate = job_module(phase, "schedule"), job_module(phase, "gate")
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.02)
    actor = SimpleNamespace(actor_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0),
                            strategy=SimpleNamespace(args=SimpleNamespace(train=SimpleNamespace(max_epochs=2))))
    optimizer.step()  # (a step of the run before: torch warns of a schedule stepped first)
    schedule.apply_to_actor(actor, plan)
    rate = gate.step_lr_schedule(actor)
    assert actor.actor_scheduler.last_epoch == 2
    assert rate == pytest.approx(local_rates(job[0])["s"][2]) == pytest.approx(optimizer.param_groups[0]["lr"])
