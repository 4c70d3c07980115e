"""One driver for a job's steps: the job's step k plays the local trainer's step k.

A compiled job's prompts.jsonl is the local StepPlanner's walk, each line labelled with
its group's Draw; OpenRLHF 0.11.2's own `prepare_datasets` with its own
`DeepspeedStrategy.setup_dataloader` and the job's askspec_ext/sequential.py hands them
to the rollout in that order, so each RL step's `--rollout.batch_size` prompts are the
local step's groups (without the hook, OpenRLHF's seeded shuffle mixes steps); and the
generated agent, driven by OpenRLHF's own generate_responses, plays each group under the
seeds and group ids the local trainer plays it under."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from askspec.ir import model as ir
from askspec.runtime.store.views import open_store
from askspec.runtime.train.planner import Draw
from askspec.runtime.train.trainer import LocalTrainer

from openrlhf_harness import assert_pin_refusals, launch_argv, parse_train_ppo_ray, smollm2_tokenizer, train_flags
from openrlhf_modules import load_module, ray_stand_in
from test_openrlhf_agent import drive, make_job

SPEC = Path(__file__).parent / "specs" / "uneven_steps.ask"  # 3 elements, 2 a step, 4 steps


def local_groups(job: Path) -> tuple[ir.Experiment, LocalTrainer, list[list[tuple[str, int, Draw]]]]:
    """The local trainer's steps of the job's spec: per step, its groups' (game, element, draw)."""
    exp = ir.Experiment.model_validate(json.loads((job / "job.json").read_text())["experiment"])
    local = LocalTrainer(exp, params=exp.param_values(), datasets={}, seed=0, resolver=None, run_dir=None)
    steps = [[(e.game.name, e.item_index, d) for e, d in local.planners[sl.phase.name].groups(sl.n, sl.step)]
             for sl in local.slots]
    return exp, local, steps


def openrlhf_loader(job: Path, monkeypatch, job_module, hooked: bool):
    """The prompt loader OpenRLHF's PPO trainer builds for the job (its `prepare_datasets`
    on its DeepspeedStrategy, the launch line's args), with the job's hook or without."""
    from openrlhf.datasets.prompts_dataset import PromptDataset
    from openrlhf.datasets.utils import blending_datasets
    from openrlhf.utils.logging_utils import init_logger

    register = lambda name, module: monkeypatch.setitem(sys.modules, name, module)  # noqa: E731
    # torchdata is not installed here: torch's DataLoader, whose arguments StatefulDataLoader takes (a stand-in)
    strategy_module = load_module("utils/deepspeed/deepspeed.py", "openrlhf.utils.deepspeed.deepspeed", register,
                                  {"StatefulDataLoader": torch.utils.data.DataLoader, "dist": torch.distributed})
    if hooked:
        job_module(job, "sequential").install(strategy_module)
    trainer = load_module("trainer/ppo_trainer.py", "openrlhf.trainer.ppo_trainer", register,
                          {"ray": ray_stand_in(), "init_logger": init_logger, "PromptDataset": PromptDataset,
                           "blending_datasets": blending_datasets})
    (call,) = launch_argv(job / "launch.sh", job.parent)
    args = parse_train_ppo_ray(train_flags(call))
    args.data.prompt_dataset = str(job / "prompts.jsonl")
    strategy = object.__new__(strategy_module.DeepspeedStrategy)
    strategy.args, strategy.seed = args, args.train.seed
    strategy.print = lambda *a, **k: None
    tokenizer = SimpleNamespace(apply_chat_template=None)
    loader, _, _ = trainer.prepare_datasets(strategy, tokenizer)
    return loader, args


def rl_steps(loader, args) -> list[list[tuple[str, int, Draw | None]]]:
    """The prompts of each RL step as OpenRLHF's samples generator draws them: the loader's
    batches of one, `--rollout.batch_size` a step."""
    labels = [json.loads(label) for batch in loader for label in batch[2]]
    per = args.rollout.batch_size
    return [[(lb["game"], lb["element"], Draw.from_label(lb.get("draw"))) for lb in labels[k:k + per]]
            for k in range(0, len(labels), per)]


def test_each_rl_step_plays_the_local_steps_groups(tmp_path, monkeypatch, job_module) -> None:
    job = make_job(SPEC, tmp_path / "job", {})
    assert json.loads((job / "job.json").read_text())["extension"]["prompt_order"] == "sequential"
    _, _, want = local_groups(job)
    loader, args = openrlhf_loader(job, monkeypatch, job_module, hooked=True)
    got = rl_steps(loader, args)
    assert got == want and len(got) == 4  # the groups, their order and their draws: seeds and group ids
    assert [d.epoch for step in got for _, _, d in step] == [0, 0, 0, 1, 1, 1, 2, 2]
    # OpenRLHF's own loader shuffles (seeded): its steps mix the local steps' groups
    shuffled = rl_steps(*openrlhf_loader(job, monkeypatch, job_module, hooked=False))
    assert sorted(map(repr, sum(shuffled, []))) == sorted(map(repr, sum(want, []))) and shuffled != want


@pytest.mark.slow  # the SmolLM2 tokenizer (converted once from the packaged GGUF)
def test_a_drawn_line_plays_the_local_steps_sessions(tmp_path, monkeypatch) -> None:
    """The agent's sessions of the job's first two steps (OpenRLHF's generate_responses over
    the prompts in order) are the local trainer's plans of steps 1 and 2: the same step,
    group id, seed and bindings, member by member."""
    job = make_job(SPEC, tmp_path / "job", {})
    _, local, _ = local_groups(job)
    want = []
    for sl in local.slots[:2]:
        for p in local.planners[sl.phase.name].plans(sl.n, local.index0[sl.step - 1], sl.step):
            want.append((p.step, p.group_id, p.seed, p.bindings))
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    tokenizer = smollm2_tokenizer()
    responses, _ = asyncio.run(drive(job, tokenizer, elements=4, group=2, replies=lambda prompt: "ok"))
    assert len(responses) == len(want) == 8
    (run,) = (tmp_path / "agent-runs").iterdir()
    rows = open_store(str(run)).execute(
        "select step, group_id, seed, params from sessions order by session_id").fetchall()
    got = [(step, group_id, seed, json.loads(params) if isinstance(params, str) else params)
           for step, group_id, seed, params in rows]
    assert got == want


def test_the_hook_is_pinned_to_openrlhf_0_11_2(tmp_path, monkeypatch, job_module) -> None:
    job = make_job(SPEC, tmp_path / "job", {})
    hook = job_module(job, "sequential")
    assert_pin_refusals(hook, "def setup_dataloader(self, replay_buffer, batch_size, shuffle=True): ...", monkeypatch)
