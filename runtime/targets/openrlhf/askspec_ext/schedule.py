"""askspec's learning-rate schedule on OpenRLHF 0.11.2's actor: the role's warm-up and
decay laid out over the role's whole schedule, as askspec's own trainer lays them out
(runtime/train/config.py's `lr_multiplier`), not over one phase.

OpenRLHF builds the actor's scheduler in `PolicyModelActor.init_model_from_pretrained`
(DeepspeedStrategy._ds_init_train_model: transformers' `get_scheduler`, a LambdaLR over
`max_steps`, the optimizer steps of this launch's prompt data set). In a job of several
phases each phase is one launch, so each builds a scheduler over its own steps; the
role's DeepSpeed checkpoint then restores the scheduler's step (askspec_ext/carry.py), but
its multiplier is still the phase's: past the first phase a cosine decay sits at its
floor, and a warm-up would start again. transformers' schedules also count one step
differently from askspec's (their warm-up starts at 0, the local one at lr/warmup; their
cosine reaches the floor one step after the last).

The hook gives the scheduler askspec's multiplier once the actor is built (and its
checkpoint loaded), from the driver (`install`: the actor group's init queues
`apply_to_actor` on each policy actor; a patch inside the workers would not reach
PolicyModelActor, a Ray actor class whose methods travel from the driver by value): the job's `extension.lr_schedule` names the role's whole schedule
(runtime/train/config.py's `lr_schedule`: `steps`, the local trainer's, every phase of the role together;
`warmup`, `decay`, `floor` = min_lr / lr), and the scheduler's step k (OpenRLHF steps it once per optimizer
step, `--train.max_epochs` of them per rollout batch) is askspec's step k // epochs, whose
epochs all train at that step's rate, as locally. The learning rate of the step about to
run is set at once, so the first step (or the first of a later phase) trains at askspec's
rate too. The multiplier is a plain function: a LambdaLR's checkpoint keeps no state of it,
so a later phase's own hook supplies it again.

The multi-policy job builds its actors itself and applies `apply_to_actor` through the
actor group (`__ray_call__`), with each role's own settings."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from . import pinned

MODULE = "openrlhf.trainer.ray.launcher"
ACTOR_MODULE = "openrlhf.trainer.ray.ppo_actor"
HOOKED = [("trainer/ray/launcher.py", "RayActorGroup", "async_init_model_from_pretrained"),
          ("trainer/ray/ppo_actor.py", "PolicyModelActor", "init_model_from_pretrained"),
          ("utils/deepspeed/deepspeed.py", "DeepspeedStrategy", "_ds_init_train_model")]
# sha256 of the hooked methods as OpenRLHF 0.11.2 ships them (pinned.fingerprint(sources()))
FINGERPRINT = "eea6af0e9fc089eb837a81e4575b5e7b698dce2cd18ffd87a31b87b313795b71"


def sources() -> list[str]:
    return [pinned.method_source(*h) for h in HOOKED]


def check_version() -> None:
    pinned.check("learning-rate schedule extension", "RayActorGroup.async_init_model_from_pretrained, "
                 "PolicyModelActor.init_model_from_pretrained and DeepspeedStrategy._ds_init_train_model",
                 sources, FINGERPRINT, "train with askspec's own trainer")


def used(settings: dict[str, Any]) -> bool:
    return bool(settings.get("lr_schedule"))


def multiplier(plan: dict[str, Any], epochs: int = 1) -> Callable[[int], float]:
    """The LambdaLR multiplier of scheduler step k: askspec's for its step k // epochs."""
    from askspec.runtime.train.config import lr_multiplier

    per_step = max(1, int(epochs))

    def factor(k: int) -> float:  # (a plain function: a LambdaLR's checkpoint keeps none of it)
        return lr_multiplier(k // per_step, **plan)

    return factor


def apply(scheduler: Any, plan: dict[str, Any], epochs: int = 1) -> float:
    """Make `scheduler` (a LambdaLR, at the step its checkpoint left it) follow `plan` from
    now on, and set the learning rate of the optimizer step about to run; that rate."""
    if not hasattr(scheduler, "lr_lambdas") or not hasattr(scheduler, "base_lrs"):
        raise pinned.VersionMismatch(f"askspec's learning-rate schedule extension expects OpenRLHF "
                                     f"{pinned.WRITTEN_FOR}'s LambdaLR scheduler, not {type(scheduler).__name__}")
    fn = multiplier(plan, epochs)
    scheduler.lr_lambdas = [fn for _ in scheduler.lr_lambdas]
    rates = [base * fn(scheduler.last_epoch) for base in scheduler.base_lrs]
    for group, lr in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = lr
    scheduler._last_lr = rates  # (what get_last_lr() reports until its next step)
    return rates[0]


def epochs_of(args: Any) -> int:
    """OpenRLHF's optimizer steps per rollout batch (`--train.max_epochs`)."""
    return int(getattr(getattr(args, "train", None), "max_epochs", 1) or 1)


def apply_to_actor(actor: Any, plan: dict[str, Any]) -> float:
    """Run on a PolicyModelActor (Ray's `__ray_call__(fn, *args)` calls `fn(actor, *args)`):
    `apply` to its scheduler."""
    return apply(actor.actor_scheduler, plan, epochs_of(actor.strategy.args))


def install(launcher: Any = None, actor_module: Any = None, plan: dict[str, Any] | None = None) -> None:
    """Have every policy actor group the job builds take askspec's schedule (`plan`, by
    default job.json's) once its actors are built (idempotent). In the driver:
    `RayActorGroup` is a plain class there, and its init call queues `apply_to_actor` on
    each actor right behind the actor's own init (a Ray actor runs its calls in order),
    among the refs `train()` waits for."""
    launcher = launcher or importlib.import_module(MODULE)
    if getattr(getattr(launcher, "RayActorGroup", None), "_askspec_schedule", None) is not None:
        return
    check_version()  # before RayActorGroup is looked up: another release may not have it
    plan = plan or pinned.job_settings().get("lr_schedule")
    cls = launcher.RayActorGroup
    original = cls.async_init_model_from_pretrained

    def async_init_model_from_pretrained(self, *args, **kwargs):
        refs = original(self, *args, **kwargs)
        # (looked up at the call: the actor module imports the launcher, not the other way)
        policy = (actor_module or importlib.import_module(ACTOR_MODULE)).PolicyModelActor
        if plan and self.ray_actor_type is policy:
            refs = list(refs) + self.async_run_method("__ray_call__", apply_to_actor, plan)
        return refs

    async_init_model_from_pretrained.__wrapped__ = original  # type: ignore[attr-defined]
    cls.async_init_model_from_pretrained = async_init_model_from_pretrained
    cls._askspec_schedule = original


def install_when_loaded() -> None:
    """In the job's driver: `install` once OpenRLHF's train_ppo_ray imports the launcher."""
    pinned.install_when_loaded(MODULE, install)
