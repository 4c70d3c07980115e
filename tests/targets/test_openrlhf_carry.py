"""A role's state carried across the phases of an OpenRLHF job (askspec_ext/carry.py):
OpenRLHF 0.11.2's own `PPOTrainer.fit` loop (its `train_step`, `ppo_train`,
`init_checkpoint_states` and `save_logs_and_checkpoints`, on CPU) runs two phases of one
role the way driver.sh starts them (`--ckpt.load_enable --ckpt.max_num 1`, one
`--ckpt.path` per role). The actor group is a test double that saves and loads its tiny
model's weights, AdamW and scheduler states as `PolicyModelActor` does through DeepSpeed
(the GPU part). With the hook, phase 1 then phase 2 end where one 4-step run ends — same
weights, AdamW step 4, scheduler step 4 — with phase 2 playing all its own prompts and
the loaded weights sent to vLLM before it generates; OpenRLHF's resume alone would carry
phase 1's step and prompt-loader position into phase 2 (and never save: save_steps -1).
The novelty()/diversity() histories carry too: a phase's agent starts from the calls of
the phases committed before it (phase_data's state -> the phase's history.json)."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from askspec.cli import main

from openrlhf_harness import launch_argv, parse_train_ppo_ray, train_flags
from openrlhf_modules import ppo_trainer, samples_generator
from test_openrlhf_empty_step import SPEC, samples
from test_openrlhf_gate import Maker, TinyActors, same


class Actors(TinyActors):
    """OpenRLHF's actor group as a test double (test_openrlhf_gate's: a tiny torch model,
    one AdamW step per `fit`) with a LambdaLR (warm-up over 3 steps) stepped after it;
    `save_checkpoint` and the load at construction (ckpt.load_enable, a checkpoint at
    ckpt.path/_actor) keep the weights, optimizer and scheduler states and the client
    states, as PolicyModelActor's save_checkpoint and init_model_from_pretrained do through
    DeepSpeed."""

    def __init__(self, args) -> None:
        super().__init__()  # the role's initial weights (--actor.model_name_or_path)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.optim, lambda s: min(1.0, (s + 1) / 3))
        self.args, self.states, self.broadcasts, self.saves = args, {}, [], []
        path = Path(args.ckpt.path) / "_actor"
        if args.ckpt.load_enable and path.exists():
            saved = torch.load(path / "state.pt", weights_only=False)
            self.model.load_state_dict(saved["model"])
            self.optim.load_state_dict(saved["optim"])
            self.sched.load_state_dict(saved["sched"])
            self.states = saved["client"]

    def async_run_method(self, method_name: str, **kw) -> list:
        if method_name == "get_checkpoint_states":
            return [self.states]
        if method_name == "broadcast_to_vllm":
            self.broadcasts.append(copy.deepcopy(self.model.state_dict()))
            return []
        if method_name == "save_checkpoint":
            path = Path(self.args.ckpt.path) / "_actor"
            path.mkdir(parents=True, exist_ok=True)
            torch.save({"model": self.model.state_dict(), "optim": self.optim.state_dict(),
                        "sched": self.sched.state_dict(), "client": kw["client_states"]}, path / "state.pt")
            self.saves.append(kw["tag"])
            return []
        status = super().async_run_method(method_name, **kw)
        self.sched.step()
        return status


class Loader:
    """The phase's prompt loader (OpenRLHF's: one prompt a batch); records a restored position."""

    def __init__(self, prompts: int) -> None:
        self.prompts, self.restored = prompts, []

    def __len__(self) -> int:
        return self.prompts

    def state_dict(self) -> dict:
        return {"position": "end of its phase"}

    def load_state_dict(self, state: dict) -> None:
        self.restored.append(state)


class Generator:
    """OpenRLHF's samples generator as a test double: the phase's batches, in order, each
    `prompts` prompts of the loader."""

    def __init__(self, batches: list, prompts: int) -> None:
        self.batches, self.prompts, self.played = list(batches), prompts, 0

    def generate_samples(self, **kw):
        self.played += 1
        batch = self.batches.pop(0)
        return batch, 1.0, self.prompts, not self.batches


@pytest.fixture
def phase(tmp_path, monkeypatch):
    """`run(batches, carry)`: one phase of the role (OpenRLHF's PPOTrainer.fit, `carry`:
    the job's hook installed), its checkpoint at tmp/ckpt; returns (actors, loader, generator)."""
    (tmp_path / "w.ask").write_text(SPEC)
    job = tmp_path / "job"
    assert main(["compile", str(tmp_path / "w.ask"), "--target", "openrlhf", "-o", str(job)]) == 0
    register = lambda name, module: monkeypatch.setitem(sys.modules, name, module)  # noqa: E731
    module, generator = ppo_trainer(register), samples_generator(register)
    (call,) = launch_argv(job / "launch.sh", tmp_path)
    flags = [*train_flags(call), "--ckpt.load_enable", "--ckpt.max_num", "1"]
    base = parse_train_ppo_ray(flags)
    assert base.ckpt.load_enable and base.ckpt.max_num == 1  # OpenRLHF's own parser takes driver.sh's flags
    original = (module.BasePPOTrainer.init_checkpoint_states, module.BasePPOTrainer.save_logs_and_checkpoints)

    def run(batches: list[list[bool]], carry: bool):
        args = copy.deepcopy(base)
        args.ckpt.path = str(tmp_path / "ckpt")
        args.eval.steps = args.ckpt.save_steps = float("inf")  # as PPOTrainer.__init__ sets -1
        if carry:
            sys.path.insert(0, str(job))
            try:
                from askspec_ext import carry as ext  # the job's own copy
            finally:
                sys.path.remove(str(job))
            ext.install(module)
        else:
            module.BasePPOTrainer.init_checkpoint_states, module.BasePPOTrainer.save_logs_and_checkpoints = original
            module.BasePPOTrainer._askspec_carry = None
        t = object.__new__(module.PPOTrainer)
        actors = Actors(args)
        t.args, t.strategy = args, type("S", (), {"args": args})()
        t.actor_model_group, t.critic_model_group, t.vllm_engines = actors, None, None
        t.experience_maker = Maker()
        t.tokenizer = type("T", (), {"decode": staticmethod(lambda seq, skip_special_tokens=True: ["..."])})()
        t.kl_ctl = module.FixedKLController(0.0)
        t.wandb_logger = t.tensorboard_logger = t.eval_dataloader = None
        t.best_eval_metric_value, t.best_eval_metric_key, t._latest_eval_metric_value = float("-inf"), "", None
        t.generate_kwargs = {}
        t.prompts_dataloader = Loader(len(batches) * args.rollout.batch_size)
        t.samples_generator = Generator([samples(generator, job, b) for b in batches], args.rollout.batch_size)
        t.fit()
        return actors, t.prompts_dataloader, t.samples_generator

    yield run
    module.BasePPOTrainer.init_checkpoint_states, module.BasePPOTrainer.save_logs_and_checkpoints = original
    for name in [n for n in sys.modules if n == "askspec_ext" or n.startswith("askspec_ext.")]:
        del sys.modules[name]


STEPS = [[True, True, False, True], [True, False, True, True], [True, True, True, False], [False, True, True, True]]


def test_two_phases_continue_as_one_run(phase, tmp_path) -> None:
    whole, _, _ = phase(STEPS, carry=False)  # one run of 4 steps, no checkpoint (the reference)
    assert whole.optim.state_dict()["state"][0]["step"] == 4 and not (tmp_path / "ckpt").exists()
    first, _, _ = phase(STEPS[:2], carry=True)
    assert first.saves == ["global_step2"]  # saved at the phase's last step, by OpenRLHF's own save
    assert first.broadcasts == []  # nothing loaded: vLLM already serves the initial weights
    second, loader, played = phase(STEPS[2:], carry=True)
    assert played.played == 2 and loader.restored == []  # its own prompts, from the first
    assert same(second.broadcasts[0], first.model.state_dict())  # vLLM gets the carried weights before generating
    assert second.saves == ["global_step2"]
    assert same(second.model.state_dict(), whole.model.state_dict())
    assert same(second.optim.state_dict(), whole.optim.state_dict())  # AdamW's moments and step 4
    assert second.sched.state_dict()["last_epoch"] == whole.sched.state_dict()["last_epoch"] == 4


def test_without_the_hook_openrlhf_resumes_phase_1(phase, tmp_path) -> None:
    """OpenRLHF's own resume (ckpt.load_enable, no hook) takes the next phase for phase 1
    resumed: nothing is saved at the phase's end (save_steps -1), and a checkpoint there
    would restore phase 1's step and prompt position into phase 2."""
    first, _, _ = phase(STEPS[:2], carry=False)
    assert first.saves == [] and not (tmp_path / "ckpt").exists()
    phase(STEPS[:2], carry=True)  # a checkpoint of phase 1 (the hook's save)
    second, loader, _ = phase(STEPS[2:], carry=False)
    assert loader.restored == [{"position": "end of its phase"}]  # phase 2's loader moved to phase 1's position
    assert second.optim.state_dict()["state"][0]["step"] == 4  # the state itself loads
    assert os.listdir(tmp_path / "ckpt" / "_actor") == ["state.pt"]
    assert json.dumps(second.states["global_step"]) == "2"


def test_the_agent_starts_from_the_committed_phases_novelty_history(tmp_path, monkeypatch) -> None:
    """The novelty() history of a phase's agent: the calls of every phase committed before
    it, which the job's buffer state keeps and `phase_data prompts` writes into the phase's
    history.json; the generated agent's engine replays them (adapter.carried_history), so
    iteration 2's passage is judged against iteration 1's, as in the local run."""
    from askspec.runtime.targets.openrlhf import adapter, phase_data

    spec = Path(__file__).parent / "specs" / "pasodoble_carry.ask"
    job = tmp_path / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(job)]) == 0
    phase = job / "phase-1-proposer"
    kwargs = {"history": 100, "tau_sim": 0.3}
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "runs"))
    assert phase_data.prompts(job, phase, iteration=1) == 1
    assert json.loads((phase / phase_data.HISTORY).read_text()) == []  # nothing committed yet
    state = {"buffers": {}, "committed": ["iter-1-proposer"], "stateful": [["novelty", "s", "Cats purr when calm.", kwargs]]}
    (job / phase_data.STATE).parent.mkdir(parents=True)
    (job / phase_data.STATE).write_text(json.dumps(state))
    assert phase_data.prompts(job, phase, iteration=2) == 1
    assert json.loads((phase / phase_data.HISTORY).read_text()) == state["stateful"]
    carried = adapter.GameAgent(phase).engine().stateful
    assert carried("novelty", "s", "Cats sleep when warm.", kwargs) == 0.0  # similar to iteration 1's passage
    # a phase folder without a history (a job before its first commit): an empty one, as a fresh run's
    assert adapter.carried_history(tmp_path)("novelty", "s", "Cats sleep when warm.", kwargs) == 1.0


def test_the_async_trainers_last_step_comes_from_the_data_set(tmp_path, job_module) -> None:
    """OpenRLHF's asynchronous trainer (`max_staleness`) holds no prompt loader: the phase's
    last step is its prompts.jsonl's lines over `--rollout.batch_size`, rounded up (the
    samples generator trains a short last batch)."""
    (tmp_path / "w.ask").write_text(SPEC)
    job = tmp_path / "async"
    assert main(["compile", str(tmp_path / "w.ask"), "--target", "openrlhf", "-o", str(job)]) == 0
    carry = job_module(job, "carry")
    (call,) = launch_argv(job / "launch.sh", tmp_path)
    args = parse_train_ppo_ray(train_flags(call))
    args.data.prompt_dataset = str(tmp_path / "prompts.jsonl")
    (tmp_path / "prompts.jsonl").write_text("{}\n" * 5)
    args.rollout.batch_size, args.train.num_episodes = 2, 3
    trainer = type("AsyncTrainerActor", (), {"args": args})()
    assert carry.last_step(trainer) == 3 * 3
    args.data.max_samples = 4
    assert carry.last_step(trainer) == 2 * 3
