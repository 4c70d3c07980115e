"""A `train` block as the trainer runs it: the settings the compiler lowered into the IR
(`ir.Training.config`: defaults filled in, the algorithm resolved into an advantage
estimator, a policy loss and an aggregation, steps resolved against the schedule) and the
block's role and algorithm. Nothing is defaulted here: the IR says what will happen."""

from __future__ import annotations

from typing import Any

from askspec.ir import model as ir


class TrainConfig(ir.TrainSettings):
    """ir.TrainSettings with the block's role and algorithm (a stage derives its own with
    `model_copy(update=...)`)."""

    role: str
    algorithm: str


def config_from_ir(t: ir.Training, exp: ir.Experiment) -> TrainConfig:
    if t.config is None:
        raise ValueError(f"train {t.role}: the IR holds no lowered training settings (compile the spec "
                         "with this version of askspec)")
    return TrainConfig(role=t.role, algorithm=t.algorithm, **t.config.model_dump())


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Multiplier of `lr` for 0-based optimizer step `step` of `cfg`'s schedule."""
    return lr_multiplier(step, **lr_schedule(cfg))


def lr_schedule(cfg: ir.TrainSettings) -> dict[str, Any]:
    """The learning-rate schedule of lowered settings, as `lr_multiplier`'s arguments
    (`floor` = min_lr / lr); also an OpenRLHF job's `extension.lr_schedule`."""
    return {"steps": int(cfg.steps), "warmup": int(cfg.warmup), "decay": str(cfg.decay),
            "floor": float(cfg.min_lr / cfg.lr) if cfg.lr else 0.0}


def lr_multiplier(step: int, *, steps: int, warmup: int, decay: str, floor: float) -> float:
    """Multiplier of `lr` for 0-based optimizer step `step` of a schedule of `steps`:
    linear warm-up over `warmup` steps (from lr/warmup), then constant, or cosine decay to
    `floor` × lr at the last step. (The one rule: the local trainer's, and an OpenRLHF
    job's actor scheduler, askspec_ext/schedule.py.)"""
    import math

    if warmup and step < warmup:
        return (step + 1) / warmup
    if decay == "cosine":
        span = max(1, steps - warmup - 1)
        progress = min(1.0, (step - warmup) / span)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0
