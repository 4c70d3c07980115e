"""What a `train` block may say: every algorithm argument and hyperparameter with its type,
range and default, and the checks that turn a bad one into a diagnostic.

This table is the one source of truth for training settings: the checker validates specs
against it, and `lower_training` fills its defaults into the IR's `Training.config`, which
is all the trainer reads, so a setting can never be accepted here and ignored there, and a
changed default changes the experiment hash."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from ..ir import model as ir
from ..ir.plansize import schedule_steps
from ..ir.vocab import (ADVANTAGE_STDS, AGGREGATIONS, ALGORITHM_DEFAULTS, DECAYS, ESTIMATORS, KL_ESTIMATORS,
                        MISMATCH_ACTIONS, STD_ESTIMATORS, TRAIN_DTYPES)
from . import ast as A
from .checker_base import CheckContext


@dataclass(frozen=True)
class Setting:
    """One training setting. kind: int | number | name (one of `choices`); `low`/`high`
    bound the value (inclusive unless `open_low` / `open_high`). Every number has an upper
    bound: a value past it (`lr = 1e308`) would overflow the weights, not train them."""

    kind: str
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    choices: tuple[str, ...] = ()
    open_high: bool = False

    def range_text(self) -> str:
        """'> 0 and ≤ 1' (docs/language.md's table and E107 say the same)."""
        lo = "" if self.low is None else (f"> {_shown(self.low)}" if self.open_low else f"≥ {_shown(self.low)}")
        hi = "" if self.high is None else (f"< {_shown(self.high)}" if self.open_high else f"≤ {_shown(self.high)}")
        return " and ".join(x for x in (lo, hi) if x)

    def in_range(self, value: float) -> bool:
        low_ok = self.low is None or (value > self.low if self.open_low else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return low_ok and high_ok


def _shown(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) >= 1000 else f"{x:g}"


_CLIP = {
    "clip": Setting("number", 0.2, "PPO ratio clip ε (both sides)", 0.0, 10.0, True),
    "clip_low": Setting("number", None, "ε_low: the ratio is clipped below at 1 − ε_low (default: clip)", 0.0, 1.0),
    "clip_high": Setting("number", None, "ε_high: the ratio is clipped above at 1 + ε_high (default: clip)", 0.0, 10.0, True),
    "dual_clip": Setting("number", None, "dual-clip c > 1: negative-advantage tokens lose at most c·|A| (OpenRLHF)", 1.0, 100.0,
                         True),
}
_ESTIMATOR = {"estimator": Setting("name", "grpo", "advantage estimator", choices=ESTIMATORS)}

# algorithm -> its arguments: `train r with cispo(clip_low = 0.75, clip_high = 3.0)`
ALGORITHM_ARGS: dict[str, dict[str, Setting]] = {
    **{a: dict(_CLIP) for a in ESTIMATORS},  # an estimator's name is also the algorithm "estimator + PPO loss"
    "ppo": {**_CLIP, **_ESTIMATOR},
    "gspo": {
        "clip": Setting("number", None, "ε of both sides of the sequence-ratio clip (clip_low/clip_high override a side)",
                        0.0, 10.0, True),
        "clip_low": Setting("number", 3e-4, "ε_low of the sequence ratio (GSPO paper: 3e-4)", 0.0, 1.0),
        "clip_high": Setting("number", 4e-4, "ε_high of the sequence ratio (GSPO paper: 4e-4)", 0.0, 10.0, True),
        **_ESTIMATOR,
    },
    "cispo": {
        "clip_low": Setting("number", 1.0, "ε_low: weights are clipped below at 1 − ε_low (1.0: no lower clip)", 0.0, 1.0),
        "clip_high": Setting("number", 2.0, "ε_high: weights are clipped above at 1 + ε_high", 0.0, 10.0, True),
        **_ESTIMATOR,
    },
    "sft": {"min_reward": Setting("number", None, "train only on trajectories whose reward is at least this")},
}

# the block's hyperparameters: `{ group = 16; lr = 0.000001; steps = 200 }`
HYPERPARAMETERS: dict[str, Setting] = {
    "group": Setting("int", None, "rollouts per group: repeats of one game element played together "
                     "(a `sample N` game's N when omitted; 1 without one)", 1),
    "steps": Setting("int", None, "optimizer steps (default: the online schedule's steps, else 1)", 1),
    "batch": Setting("int", None, "sessions played per step, rounded up to whole groups (default: one group)", 1),
    "micro_batch": Setting("int", 8, "trajectories per forward/backward pass; gradients accumulate over the batch", 1, 4096),
    "epochs": Setting("int", 1, "optimizer updates per batch of rollouts (>1 makes the ratio clip matter)", 1, 100),
    "lr": Setting("number", 1e-6, "AdamW learning rate", 0.0, 1.0, True),
    "warmup": Setting("int", 0, "linear warm-up steps", 0, 1_000_000),
    "decay": Setting("name", "constant", "learning rate after warm-up", choices=DECAYS),
    "min_lr": Setting("number", 0.0, "cosine decay floor (at most lr)", 0.0, 1.0),
    "weight_decay": Setting("number", 0.0, "AdamW weight decay", 0.0, 1.0),
    # β = 1 would divide AdamW's bias correction by 1 − 1ᵗ = 0
    "beta1": Setting("number", 0.9, "AdamW β1", 0.0, 1.0, open_high=True),
    "beta2": Setting("number", 0.999, "AdamW β2", 0.0, 1.0, open_high=True),
    "grad_clip": Setting("number", 1.0, "clip the gradient norm to this (0: off)", 0.0, 1000.0),
    "kl": Setting("number", 0.0, "coefficient of the KL penalty to the frozen initial weights", 0.0, 10.0),
    "kl_estimator": Setting("name", "k3", "per-token KL estimate: k1 = log π/π_ref, k3 = r − 1 − log r", choices=KL_ESTIMATORS),
    "std": Setting("name", ADVANTAGE_STDS[0], "the group std the grpo and group_norm estimators divide by: sample "
                   "(Bessel's n − 1, TRL and OpenRLHF) or population (n)", choices=ADVANTAGE_STDS),
    "aggregation": Setting("name", None, "how token losses become the batch loss: token (over all tokens), "
                           "sequence (per trajectory, then over trajectories), constant (Dr. GRPO: sum / "
                           "(trajectories × max_tokens)); default per algorithm", choices=AGGREGATIONS),
    "save_every": Setting("int", 25, "write a checkpoint every N steps (and after the last)", 1, 1_000_000),
    "keep_checkpoints": Setting("int", 2, "checkpoints kept (the final one always stays)", 1, 1000),
    "max_nonfinite_steps": Setting("int", 3, "how many steps may have a NaN or infinite advantage, loss or gradient: "
                                   "each is not applied (weights unchanged, no checkpoint); at this many the run stops",
                                   1, 1000),
    "max_staleness": Setting("int", 0, "asynchronous rollouts: a step's rollouts may be sampled by weights up to this many "
                             "updates older than the ones trained (0: on-policy, play and update take turns)", 0, 100),
    "is_bound": Setting("number", 2.0, "truncation of the importance weight π_train/π_sample of a stale rollout's tokens "
                        "(max_staleness > 0)", 1.0, 100.0),
    "max_mismatch": Setting("number", None, "bound on an on-policy step's KL between the sampler's and the trainer's "
                            "log-probabilities of its tokens (train_steps.mismatch_kl); past it the step is reported "
                            "(on_mismatch); default by the training precision: 1e-6 in float32, 1e-3 under bf16",
                            0.0, 1000.0),
    "on_mismatch": Setting("name", "warn", "an on-policy step past max_mismatch: warn (the step's line and the closing "
                           "summary) or error (the run stops after recording the step)", choices=MISMATCH_ACTIONS),
    "dtype": Setting("name", "auto", "training precision: auto (float32 on CPU, bf16 autocast on GPU), float32, bfloat16",
                     choices=TRAIN_DTYPES),
}
BUFFER_SETTINGS = ("replay",)  # names a buffer; checked by the compiler against declared buffers
GATE_SETTINGS = ("update_when",)  # an expression over the step's sessions; checked in metric scope (E407)
# names other trainers use for our settings, so a diagnostic can name the right key
ALIASES = {"learning_rate": "lr", "warmup_steps": "warmup", "lr_warmup": "warmup", "max_grad_norm": "grad_clip",
           "clip_grad": "grad_clip", "gradient_clipping": "grad_clip", "beta": "kl", "kl_coef": "kl",
           "init_kl_coef": "kl", "batch_size": "batch", "micro_batch_size": "micro_batch", "num_epochs": "epochs",
           "lr_scheduler": "decay", "lr_schedule": "decay", "num_generations": "group", "group_size": "group",
           "max_steps": "steps", "num_steps": "steps", "eps_clip": "clip", "epsilon": "clip",
           "epsilon_high": "clip_high", "epsilon_low": "clip_low", "loss_agg": "aggregation"}


def lower_training(exp: ir.Experiment, written: Mapping[str, Mapping[str, Any]]) -> ir.Experiment:
    """Fill in each train block's `config` and `given` from `written` (a trained role ->
    its block's checked algorithm arguments and settings, by name, as the spec writes
    them): the settings with the defaults above, the algorithm resolved into estimator,
    loss and aggregation, and the steps resolved against the schedule. The compiler calls
    it once the schedule is known; the trainer and the targets read only the result."""
    for t in exp.training:
        values = dict(written.get(t.role, {}))
        t.given = sorted(values)
        t.config = _lowered(t, values, exp)
    return exp


def _lowered(t: ir.Training, written: dict[str, Any], exp: ir.Experiment) -> ir.TrainSettings:
    estimator, loss, aggregation = ALGORITHM_DEFAULTS[t.algorithm]
    allowed = ALGORITHM_ARGS[t.algorithm]
    given = {k: v for k, v in written.items() if k in allowed}  # the algorithm's arguments the spec writes
    args = {k: s.default for k, s in allowed.items()}
    args.update(given)
    hyper: dict[str, Any] = {k: s.default for k, s in HYPERPARAMETERS.items()}
    hyper.update({k: v for k, v in written.items() if k not in allowed})
    if "estimator" in args:
        estimator = args["estimator"]
    if loss == "ppo":
        base = args.get("clip", 0.2)
        clip_low = args.get("clip_low") if args.get("clip_low") is not None else base
        clip_high = args.get("clip_high") if args.get("clip_high") is not None else base
    else:  # gspo, cispo: their own defaults; gspo's `clip` sets both sides unless one is given
        base = given.get("clip")
        clip_low = given.get("clip_low", base if base is not None else args.get("clip_low") or 0.0)
        clip_high = given.get("clip_high", base if base is not None else args.get("clip_high") or 0.0)
    assert clip_low is not None and clip_high is not None  # ppo's `clip` defaults to 0.2, the others' sides to 0.0
    return ir.TrainSettings(
        estimator=estimator, loss=loss, aggregation=hyper.get("aggregation") or aggregation,
        clip_low=float(clip_low), clip_high=float(clip_high), dual_clip=args.get("dual_clip"),
        min_reward=args.get("min_reward"), group=hyper.get("group"),
        steps=schedule_steps(t.role, hyper.get("steps"), exp),
        batch=hyper.get("batch"), micro_batch=int(hyper["micro_batch"]), epochs=int(hyper["epochs"]),
        lr=float(hyper["lr"]), warmup=int(hyper["warmup"]), decay=hyper["decay"], min_lr=float(hyper["min_lr"]),
        weight_decay=float(hyper["weight_decay"]), beta1=float(hyper["beta1"]), beta2=float(hyper["beta2"]),
        grad_clip=float(hyper["grad_clip"]), kl=float(hyper["kl"]), kl_estimator=hyper["kl_estimator"],
        std=hyper["std"],
        save_every=int(hyper["save_every"]), keep_checkpoints=int(hyper["keep_checkpoints"]),
        max_nonfinite_steps=int(hyper["max_nonfinite_steps"]), max_staleness=int(hyper["max_staleness"]),
        is_bound=float(hyper["is_bound"]), max_mismatch=None if hyper["max_mismatch"] is None else float(hyper["max_mismatch"]),
        on_mismatch=hyper["on_mismatch"], dtype=hyper["dtype"], replay=hyper.get("replay"))


def closest(name: str, candidates) -> str | None:
    """'did you mean X?' for the valid key nearest to `name` (an alias, else by spelling)."""
    import difflib

    candidates = list(candidates)
    alias = difflib.get_close_matches(name, [a for a, k in ALIASES.items() if k in candidates], n=1, cutoff=0.8)
    if alias:
        return f"did you mean '{ALIASES[alias[0]]}'?"
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'?" if close else None


class TrainingChecks:
    """The train block's settings checks (the blocks pass calls them for each `train`),
    over the shared check context (its err, const, params, used)."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx

    def setting_value(self, name: str, s: Setting, e: A.Expr, where: str) -> Any:
        """The constant value of a setting, or None after a diagnostic."""
        if s.kind == "name":
            if isinstance(e, A.Name) and e.id not in self.ctx.params:
                value: Any = e.id
            else:
                value = self.ctx.const(e, f"{where} '{name}'")
                if value is None:
                    return None
            if value not in s.choices:
                from .exprs import suggest

                hint = (suggest(str(value), s.choices) if isinstance(value, str) else None) or f"one of: {', '.join(s.choices)}"
                self.ctx.err("E107", f"{where} '{name}' is one of {', '.join(s.choices)}, found {value!r}", e.span, hint)
                return None
            return value
        value = self.ctx.const(e, f"{where} '{name}'")
        if value is None:
            return None
        from .types import from_json_value

        if isinstance(value, bool) or not isinstance(value, (int, float)):
            want = "a whole number" if s.kind == "int" else "a number"
            self.ctx.err("E201", f"{where} '{name}' must be {want}, found {from_json_value(value)}", e.span)
            return None
        if s.kind == "int" and int(value) != value:
            self.ctx.err("E201", f"{where} '{name}' must be a whole number, found {value!r}", e.span)
            return None
        if not s.in_range(value):
            self.ctx.err("E107", f"{where} '{name}' must be {s.range_text()}, found {value!r}", e.span,
                         "the ranges are listed in docs/language.md (train)")
            return None
        return int(value) if s.kind == "int" else float(value)

    def training_settings(self, d: A.TrainDecl, algorithm: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Check a train block's algorithm arguments and hyperparameters against the tables."""
        allowed = ALGORITHM_ARGS[algorithm]
        args: dict[str, Any] = {}
        algo_e = d.algo
        if isinstance(algo_e, A.Call):
            if algo_e.args:
                self.ctx.err("E109", f"{algorithm}(...) takes named arguments, e.g. {algorithm}({next(iter(allowed), 'x')} = ...)",
                             algo_e.args[0].span)
            for k, v in algo_e.kwargs:
                if k not in allowed:
                    where = f"argument of {algorithm}"
                    close = closest(k, allowed) or (
                        f"{algorithm} takes: {', '.join(allowed)}" if allowed else f"{algorithm} takes no arguments")
                    self.ctx.err("E105", f"unknown {where} '{k}'", v.span, close)
                    continue
                value = self.setting_value(k, allowed[k], v, f"{algorithm} argument")
                if value is not None:
                    args[k] = value
        hyper: dict[str, Any] = {}
        for a in d.attrs:
            if a.name in BUFFER_SETTINGS or a.name in GATE_SETTINGS:
                continue  # the compiler checks it names a buffer / the gate's expression
            s = HYPERPARAMETERS.get(a.name)
            if s is None:
                hint: str | None = None
                if a.name in allowed:
                    hint = f"'{a.name}' is an argument of the algorithm: {algorithm}({a.name} = ...)"
                hint = hint or closest(a.name, list(HYPERPARAMETERS) + list(BUFFER_SETTINGS) + list(GATE_SETTINGS))
                self.ctx.err("E105", f"unknown training setting '{a.name}'", a.name_span,
                             hint or f"settings: {', '.join(HYPERPARAMETERS)}, replay, update_when")
                continue
            if a.name in hyper:
                self.ctx.err("E104", f"training setting '{a.name}' given twice", a.name_span)
            value = self.setting_value(a.name, s, a.value, "training setting")
            if value is not None:
                hyper[a.name] = value
        lr = hyper.get("lr", HYPERPARAMETERS["lr"].default)
        if hyper.get("min_lr", 0.0) > lr:  # the cosine floor would raise the learning rate, not lower it
            span = next(a.value.span for a in d.attrs if a.name == "min_lr")
            self.ctx.err("E107", f"training setting 'min_lr' ({hyper['min_lr']!r}) must be at most lr ({lr!r})", span)
        if "std" in hyper:  # only a std-dividing estimator reads it; elsewhere it would be silently ignored
            estimator = args.get("estimator", ALGORITHM_DEFAULTS[algorithm][0])
            if estimator not in STD_ESTIMATORS:
                span = next(a.value.span for a in d.attrs if a.name == "std")
                self.ctx.err("E107", f"training setting 'std' is read only by the estimators that divide by the group's std "
                                     f"({', '.join(STD_ESTIMATORS)}); this block's is {estimator or 'none (sft)'}", span,
                             "remove 'std', or choose a grpo or group_norm estimator")
        if "is_bound" in hyper and not hyper.get("max_staleness"):  # on-policy tokens have weight 1: nothing to bound
            span = next(a.value.span for a in d.attrs if a.name == "is_bound")
            self.ctx.err("E107", "training setting 'is_bound' bounds the importance weight of stale rollouts, and this "
                                 "block's are all on-policy (max_staleness = 0)", span,
                         "remove 'is_bound', or set max_staleness = 1 (or more)")
        return args, hyper
