"""The job's prompts in the order askspec wrote them, on OpenRLHF 0.11.2: each RL step
trains on the local step's groups.

A job's prompts.jsonl is the local planner's walk, a line per group in step order, each
labelled with its place in the local schedule (askspec.runtime.train.planner.Draw,
written by generate.py and phase_data.py): its first `--rollout.batch_size` lines are the
local step 1's groups, the next ones step 2's, and so on. OpenRLHF reads them through the
loader `prepare_datasets` builds (trainer/ppo_trainer.py), `strategy.setup_dataloader(
prompts_dataset, 1, True, True, ...)`, whose `shuffle` is hard-coded True: a seeded
shuffle that would give an RL step the groups of several local steps, in another order.

The hook gives `DeepspeedStrategy.setup_dataloader` `shuffle=False` (a sequential sampler;
under a DistributedSampler, each rank's share in order): a PPO job calls it only for its
prompt loader and its eval loader, which OpenRLHF already reads in order. So the job's
step k plays the local step k's groups, under the seeds and group ids the agent takes
from their draws (adapter.py), as the local trainer plays them.

Installed in every RL job (job.json's `extension.prompt_order`) where the PPO trainer
builds its loader: a Ray worker (the PPO trainer is a Ray actor), once the worker imports
the strategy's module. Refuses an OpenRLHF whose hooked code is not 0.11.2's."""

from __future__ import annotations

import importlib
from typing import Any

from . import pinned

MODULE = "openrlhf.utils.deepspeed.deepspeed"
HOOKED = [("utils/deepspeed/deepspeed.py", "DeepspeedStrategy", "setup_dataloader"),
          ("trainer/ppo_trainer.py", None, "prepare_datasets")]
# sha256 of the hooked code as OpenRLHF 0.11.2 ships it (pinned.fingerprint(sources()))
FINGERPRINT = "c01f12e4d538c5cd05d7bb62a14a85877917c6591b2aa54794e7f6c034224d3b"
ORDER = "sequential"


def sources() -> list[str]:
    return [pinned.method_source(*h) for h in HOOKED]


def check_version() -> None:
    pinned.check("prompt-order extension", "DeepspeedStrategy.setup_dataloader and prepare_datasets", sources,
                 FINGERPRINT, "compile the job with this askspec's OpenRLHF target for OpenRLHF 0.11.2")


def used(settings: dict[str, Any]) -> bool:
    return settings.get("prompt_order") == ORDER


def install(module: Any = None) -> None:
    """Give the strategy's loaders `shuffle=False` (once)."""
    check_version()
    module = module if module is not None else importlib.import_module(MODULE)
    cls = module.DeepspeedStrategy
    original = cls.setup_dataloader
    if getattr(original, "askspec_sequential", False):
        return

    def setup_dataloader(self: Any, replay_buffer: Any, batch_size: int, pin_memory: bool = False,
                         shuffle: bool = True, *args: Any, **kwargs: Any) -> Any:
        return original(self, replay_buffer, batch_size, pin_memory, False, *args, **kwargs)

    setup_dataloader.askspec_sequential = True  # type: ignore[attr-defined]
    setup_dataloader.__wrapped__ = original  # type: ignore[attr-defined]
    cls.setup_dataloader = setup_dataloader


def install_when_loaded() -> None:
    pinned.install_when_loaded(MODULE, install)
