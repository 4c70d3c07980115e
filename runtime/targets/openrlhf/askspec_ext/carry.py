"""A role's training state carried from one phase of an RL schedule to its next, on
OpenRLHF 0.11.2, as askspec's own trainer keeps one policy per role for the whole run:
the weights, AdamW's moments and step, the learning-rate scheduler's step, and the KL
reference (the role's weights when the schedule started, not the previous phase's).

Each phase is one OpenRLHF run (driver.sh). Its own checkpointing carries the state:
driver.sh gives every phase of a role the same `--ckpt.path` (ckpt/ROLE-ds), passes
`--ckpt.load_enable --ckpt.max_num 1`, and starts it from the role's weights at the
start of the schedule (`--actor.model_name_or_path`, which OpenRLHF also loads the
reference model and the vLLM engines from). OpenRLHF's `PolicyModelActor` then loads the
previous phase's DeepSpeed checkpoint (`strategy.load_ckpt`: weights, optimizer and
scheduler states) over those weights. Two things of OpenRLHF's resume do not fit a new
phase, and this hook changes them:

- `BasePPOTrainer.init_checkpoint_states` returns the checkpoint's step, episode and
  prompt-loader position, which would make the new phase skip its own first prompts:
  the hook returns a fresh phase's (step 0, episode 0, no loader state) and, when a
  checkpoint was loaded, sends the loaded weights to vLLM (OpenRLHF does that only when
  it resumes a step > 0, and its engines started from the schedule's initial weights).
- OpenRLHF saves a checkpoint every `--ckpt.save_steps` steps (default never): the hook
  has `save_logs_and_checkpoints` save at the phase's last step (`last_step`), with
  OpenRLHF's own save (actor and critic).

job.json's `extension.carry_state` asks for it (every phase of a multi-phase schedule).
`install()` wraps the methods (once); `install_when_loaded()` is the Ray workers' hook.
Both refuse an OpenRLHF whose hooked code is not 0.11.2's."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

from . import pinned

MODULE = "openrlhf.trainer.ppo_trainer"
HOOKED = [("trainer/ppo_trainer.py", "BasePPOTrainer", "init_checkpoint_states"),
          ("trainer/ppo_trainer.py", "BasePPOTrainer", "save_logs_and_checkpoints"),
          ("trainer/ppo_trainer.py", "PPOTrainer", "fit"),
          ("trainer/ray/ppo_actor.py", "PolicyModelActor", "init_model_from_pretrained")]
# sha256 of the hooked methods as OpenRLHF 0.11.2 ships them (pinned.fingerprint(sources()))
FINGERPRINT = "9df8ab64a1e719eb8364309046664d4faf9e85d4ba2d944226c3aac9e5b2a55a"
# what the driver passes to every phase that carries its role's state (driver.sh.j2)
FLAGS = ("--ckpt.load_enable", "--ckpt.max_num", "1")


def sources() -> list[str]:
    return [pinned.method_source(*h) for h in HOOKED]


def check_version() -> None:
    pinned.check("state-carrying extension", "BasePPOTrainer.init_checkpoint_states and save_logs_and_checkpoints, "
                 "PPOTrainer.fit and PolicyModelActor.init_model_from_pretrained",
                 sources(), FINGERPRINT, "train with askspec's own trainer")


def used(settings: dict[str, Any]) -> bool:
    return bool(settings.get("carry_state"))


def fresh_phase() -> dict[str, Any]:
    """What OpenRLHF's init_checkpoint_states returns when it loads nothing: a phase's start."""
    return {"episode": 0, "global_step": 0, "total_consumed_prompts": 0, "data_loader_state_dict": {}}


def last_step(trainer: Any) -> int | None:
    """The global step a phase ends at (counted from 0 at its start): OpenRLHF's samples
    generator takes `--rollout.batch_size` prompts a step from its prompt loader (one
    prompt a batch), the last step what is left, every episode. The asynchronous trainer
    (`max_staleness`) holds no loader: its prompts are then the data set's lines (the
    job's prompts.jsonl, at most `--data.max_samples`). None when neither is known."""
    args = trainer.args
    loader = getattr(trainer, "prompts_dataloader", None)
    if loader is not None:
        prompts = len(loader)
    else:
        path = Path(str(args.data.prompt_dataset))
        if not path.is_file():
            return None
        with path.open(encoding="utf-8") as f:
            prompts = min(sum(1 for line in f if line.strip()), int(args.data.max_samples))
    return math.ceil(prompts / int(args.rollout.batch_size)) * int(args.train.num_episodes)


def install(module: Any = None) -> None:
    """Carry the role's state from the previous phase (idempotent)."""
    module = module or importlib.import_module(MODULE)
    if getattr(getattr(module, "BasePPOTrainer", None), "_askspec_carry", None) is not None:
        return
    check_version()  # before BasePPOTrainer is looked up: another release may not have it
    cls = module.BasePPOTrainer
    original_init, original_save = cls.init_checkpoint_states, cls.save_logs_and_checkpoints

    def init_checkpoint_states(self) -> dict[str, Any]:
        loaded = original_init(self)
        if loaded.get("global_step", 0) > 0:  # the role's previous phase: its weights are the actor's now
            self.broadcast_to_vllm()
        self._askspec_last_step = last_step(self)
        return fresh_phase()

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        if global_step != getattr(self, "_askspec_last_step", None):
            return original_save(self, global_step, logs_dict, client_states)
        every = self.args.ckpt.save_steps
        self.args.ckpt.save_steps = global_step  # OpenRLHF's own save, at this step
        try:
            return original_save(self, global_step, logs_dict, client_states)
        finally:
            self.args.ckpt.save_steps = every

    init_checkpoint_states.__wrapped__ = original_init  # type: ignore[attr-defined]
    save_logs_and_checkpoints.__wrapped__ = original_save  # type: ignore[attr-defined]
    cls.init_checkpoint_states = init_checkpoint_states
    cls.save_logs_and_checkpoints = save_logs_and_checkpoints
    cls._askspec_carry = (original_init, original_save)


def install_when_loaded() -> None:
    pinned.install_when_loaded(MODULE, install)
