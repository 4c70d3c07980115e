"""Test scaffolding, not a product fake: a trained role's actor group of the multi-policy
job (askspec_ext/multi_policy.py's `OpenRLHFRole`: vLLM engines, DeepSpeed policy actors
and PPOTrainer, which need a GPU) stood in by a Ray actor holding the local trainer's own
policy (runtime/train/policy.py's TrainedPolicy on the hf backend): it generates the role's
turns with the policy's backend and updates with the local trainer's update. Everything
else — the entry point's argument parsing, Ray, the step loop, the lockstep, the gates,
the checkpoints — is the job's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray


@ray.remote
class LocalRole:
    def __init__(self, cfg: Any, weights: str, options: dict[str, Any], init: str | None,
                 fail_save: int | None = None) -> None:
        import torch

        from askspec.runtime.backends.hf import default_threads
        from askspec.runtime.train.policy import TrainedPolicy

        torch.set_num_threads(default_threads())  # as `askspec run` sets them: the same float sums
        self.fail_save = fail_save  # the step whose save fails (a node lost while the job checkpoints)
        self.policy = TrainedPolicy(cfg, weights, options, init_from=Path(init) if init else None)
        if init:
            self.policy.load_optimizer(Path(init), moments=(Path(init) / "optimizer.safetensors").exists())

    def version(self) -> int:
        return self.policy.version

    def mismatch_bound(self) -> float:
        return self.policy.mismatch_bound

    async def prompt_tokenizer(self, model: str) -> Any:
        return await self.policy.backend.prompt_tokenizer(model)

    async def complete(self, request: Any) -> Any:
        return await self.policy.backend.complete(request)

    def update(self, trajectories: list) -> dict[str, Any]:
        return self.policy.update(trajectories)

    def finite(self) -> bool:
        return self.policy.finite()

    def save(self, folder: str, step: int, metrics: dict[str, Any], with_optimizer: bool) -> None:
        if step == self.fail_save:
            raise RuntimeError(f"lost while saving step {step}")
        self.policy.save(Path(folder), step, metrics, with_optimizer=with_optimizer)


def make_role(trainer: Any, cfg: Any, init: Path | None, fail_save: dict[str, int] | None = None) -> Any:
    """The role factory `multi_policy.run` takes: the role's model as the local trainer
    loads it (LocalTrainer.load_policies's options), in a LocalRole actor; `fail_save`
    (role -> step) makes that role's save of that step fail."""
    binding = trainer.resolver.resolve(cfg.role, trainer.exp.role(cfg.role).model)
    b = binding.backend
    options = {"max_batch": b.max_batch, "device": b.device_option, "dtype": b.dtype_option,
               "num_threads": b.num_threads, "cache_dir": b.cache_dir, "chat_template": b.chat_template,
               "prefix_cache": b.prefix_cache}
    return LocalRole.remote(cfg, binding.weights, {k: v for k, v in options.items() if v is not None},
                            str(init) if init else None, (fail_save or {}).get(cfg.role))
