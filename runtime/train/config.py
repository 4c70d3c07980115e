"""A `train` block as the trainer runs it: the IR's checked settings with the language's
defaults (askspec/lang/training.py) filled in, and the algorithm resolved into an
advantage estimator, a policy loss and an aggregation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from askspec.ir import model as ir
from askspec.ir.plansize import training_steps
from askspec.lang.training import ALGORITHM_ARGS, ALGORITHM_DEFAULTS, HYPERPARAMETERS


@dataclass(frozen=True)
class TrainConfig:
    role: str
    algorithm: str
    estimator: str | None  # None for sft
    loss: str  # ppo | gspo | cispo | sft
    aggregation: str  # token | sequence | constant
    clip_low: float
    clip_high: float
    dual_clip: float | None
    min_reward: float | None
    group: int | None
    steps: int
    batch: int | None
    micro_batch: int
    epochs: int
    lr: float
    warmup: int
    decay: str
    min_lr: float
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float
    kl: float
    kl_estimator: str
    save_every: int
    keep_checkpoints: int
    max_nonfinite_steps: int
    dtype: str
    replay: str | None


def config_from_ir(t: ir.Training, exp: ir.Experiment) -> TrainConfig:
    estimator, loss, aggregation = ALGORITHM_DEFAULTS[t.algorithm]
    args = {k: s.default for k, s in ALGORITHM_ARGS[t.algorithm].items()}
    args.update(t.algorithm_args)
    hyper: dict[str, Any] = {k: s.default for k, s in HYPERPARAMETERS.items()}
    hyper.update(t.hyper)
    if "estimator" in args:
        estimator = args["estimator"]
    if loss == "ppo":
        base = args.get("clip", 0.2)
        clip_low = args.get("clip_low") if args.get("clip_low") is not None else base
        clip_high = args.get("clip_high") if args.get("clip_high") is not None else base
    else:  # gspo, cispo: their own defaults; gspo's `clip` sets both sides unless one is given
        given = t.algorithm_args
        base = given.get("clip")
        clip_low = given.get("clip_low", base if base is not None else args.get("clip_low") or 0.0)
        clip_high = given.get("clip_high", base if base is not None else args.get("clip_high") or 0.0)
    steps = training_steps(t, exp)
    return TrainConfig(
        role=t.role, algorithm=t.algorithm, estimator=estimator, loss=loss,
        aggregation=hyper.get("aggregation") or aggregation,
        clip_low=float(clip_low), clip_high=float(clip_high), dual_clip=args.get("dual_clip"),
        min_reward=args.get("min_reward"), group=hyper.get("group"), steps=steps, batch=hyper.get("batch"),
        micro_batch=int(hyper["micro_batch"]), epochs=int(hyper["epochs"]), lr=float(hyper["lr"]),
        warmup=int(hyper["warmup"]), decay=str(hyper["decay"]), min_lr=float(hyper["min_lr"]),
        weight_decay=float(hyper["weight_decay"]), beta1=float(hyper["beta1"]), beta2=float(hyper["beta2"]),
        grad_clip=float(hyper["grad_clip"]), kl=float(hyper["kl"]), kl_estimator=str(hyper["kl_estimator"]),
        save_every=int(hyper["save_every"]), keep_checkpoints=int(hyper["keep_checkpoints"]),
        max_nonfinite_steps=int(hyper["max_nonfinite_steps"]), dtype=str(hyper["dtype"]),
        replay=hyper.get("replay"),
    )


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Multiplier of `lr` for 0-based optimizer step `step`: linear warm-up over `warmup`
    steps (from lr/warmup), then constant, or cosine decay to `min_lr` at the last step."""
    import math

    if cfg.warmup and step < cfg.warmup:
        return (step + 1) / cfg.warmup
    if cfg.decay == "cosine":
        span = max(1, cfg.steps - cfg.warmup - 1)
        progress = min(1.0, (step - cfg.warmup) / span)
        floor = cfg.min_lr / cfg.lr if cfg.lr else 0.0
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0
