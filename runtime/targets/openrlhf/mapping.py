"""What askspec's training vocabulary means in OpenRLHF 0.11.2: algorithms, training
settings and model names, as tables and pure functions over the IR (no I/O).

The algorithm table is the one in docs/cluster.md; a test keeps them in step."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from askspec.ir import model as ir
from askspec.runtime.train.config import lr_schedule

# askspec algorithm -> (--algo.advantage.estimator, --actor.policy_loss_type)
ALGORITHMS: dict[str, tuple[str, str]] = {
    "grpo": ("group_norm", "ppo"),
    "group_norm": ("group_norm", "ppo"),
    "dr_grpo": ("dr_grpo", "ppo"),
    "rloo": ("rloo", "ppo"),
    "reinforce": ("reinforce", "ppo"),
    "reinforce_baseline": ("reinforce_baseline", "ppo"),
    "gspo": ("group_norm", "gspo"),
    "cispo": ("group_norm", "cispo"),  # the job's askspec_ext adds the loss (askspec_ext/cispo.py)
    # askspec's ppo is the local trainer's: group-normalised (grpo) advantages and the PPO clipped loss,
    # never OpenRLHF's gae with a critic (askspec_ext/advantages.py computes the block's estimator)
    "ppo": ("group_norm", "ppo"),
}

# policy losses OpenRLHF 0.11.2 lacks, which a job's askspec_ext adds
EXTENSION_LOSSES = ("cispo",)

# algorithms OpenRLHF 0.11.2 lacks -> (what is missing, nearest supported algorithm or None)
MISSING: dict[str, tuple[str, str | None]] = {
    "sft": ("supervised fine-tuning is not a PPO-family job in OpenRLHF 0.11.2 (it is `openrlhf.cli.train_sft` "
            "on a fixed data set, with no agent)", None),
}

# estimators whose baseline is the prompt group: they need n_samples_per_prompt > 1
GROUPED_ESTIMATORS = {"group_norm", "rloo", "reinforce_baseline", "dr_grpo"}

# training settings the OpenRLHF target maps (the rest are refused, never ignored):
# docs/cluster.md's settings table; tests/targets/test_openrlhf_settings.py walks the
# language's list (askspec/lang/training.py) against this one and REFUSED
SETTINGS = ("group", "lr", "steps", "batch", "kl", "kl_estimator", "warmup", "clip", "clip_low", "clip_high",
            "dual_clip", "estimator", "decay", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip",
            "aggregation", "micro_batch", "epochs", "save_every", "keep_checkpoints", "dtype", "max_staleness",
            "is_bound", "std", "update_when")

# settings a job cannot honour -> why (E604 names the setting and says this)
REFUSED = {
    "max_nonfinite_steps": "OpenRLHF 0.11.2 has no bound on steps with a NaN or infinite loss or gradient (it "
                           "applies or skips them without counting)",
    "min_reward": "the sft algorithm is not a PPO-family job (E601), and OpenRLHF's SFT trains on every record",
    "replay": "a buffer lives in one run, and an OpenRLHF job's prompt data set is fixed when it starts",
    **dict.fromkeys(("max_mismatch", "on_mismatch"),
                    "OpenRLHF 0.11.2 does not compare each step's sampler log-probabilities with the trainer's "
                    "(askspec's own trainer does: train_steps.mismatch_kl)"),
}

# `dtype` -> --ds.param_dtype (OpenRLHF trains in bf16 or fp16 only)
DTYPES = {"auto": "bf16", "bfloat16": "bf16"}

# askspec's estimator names -> --algo.advantage.estimator (an algorithm's `estimator` argument)
ESTIMATORS = {"grpo": "group_norm", "group_norm": "group_norm", "dr_grpo": "dr_grpo", "rloo": "rloo",
              "reinforce": "reinforce", "reinforce_baseline": "reinforce_baseline"}

# `aggregation` values OpenRLHF 0.11.2 has (--actor.loss_agg_mode); Dr. GRPO's `constant` is not one
LOSS_AGGREGATION = {"token": "token-mean", "sequence": "seq-mean-token-mean"}

# packaged model names -> the Hugging Face repository vLLM and DeepSpeed load
HF_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
# the context (max_position_embeddings in its config.json) of each model HF_IDS names, which the
# compiler cannot read from a local folder: the job's max_len must fit in it (generate.model_context)
CONTEXTS = {"HuggingFaceTB/SmolLM2-135M-Instruct": 8192}

# OpenRLHF clips rewards to [-10, 10] by default; the contract sums rewards unclipped, so
# the job widens the range (a literal integer: argparse reads "-1e9" as an option name)
REWARD_CLIP = "1000000000"

# room for the prompts and the other roles' messages in the trained role's sequence
CONTEXT_ALLOWANCE = 4096

# launch.sh's default actor GPUs per node (ACTOR_NODES defaults to 1): half of an 8-GPU node, the
# rest for vLLM engines and frozen servers; a job whose step does not divide it gets the most below
# it that does (generate._actor_gpus, world.py)
ACTOR_GPUS = 4


def hf_id(weights: str) -> str:
    return HF_IDS.get(weights, weights)


@dataclass
class Schedule:
    """How many optimizer steps a job runs and how OpenRLHF is told so."""

    prompts_per_step: int  # --rollout.batch_size
    rollouts_per_step: int  # --train.batch_size (one optimizer step per rollout batch: on-policy)
    episodes: int  # --train.num_episodes
    steps: int  # optimizer steps OpenRLHF will run
    notes: list[str] = field(default_factory=list)


def schedule(elements: int, group: int, prompts: int, steps: int | None) -> Schedule:
    """OpenRLHF runs floor(elements * group / train_batch) steps per episode. `prompts`
    is one askspec step's elements (generate.step_prompts: a prompt is one element, its
    `group` rollouts the element's sessions or a session's `sample N ask` replies; a
    block without `batch`: up to 16), `steps` askspec's optimizer steps."""
    notes = []
    if prompts > elements:
        notes.append(f"{prompts} prompts per step but only {elements} elements: each step uses all {elements}")
        prompts = elements
    per_episode = max(1, elements // prompts)
    episodes = 1 if steps is None else max(1, math.ceil(steps / per_episode))
    total = per_episode * episodes
    if steps is not None and total != steps:
        notes.append(f"steps = {steps}: OpenRLHF runs whole passes over the {elements} elements "
                     f"({per_episode} steps each), so the job runs {total} steps")
    return Schedule(prompts, prompts * group, episodes, total, notes)


def training_flags(algorithm: str, t: ir.Training, group: int, sched: Schedule, sampling: dict,
                   max_len: int, seed: int) -> list[tuple[str, list[str]]]:
    """The train_ppo_ray flags a job derives from its `train` block (in launch order).
    `algorithm` is the effective (supported) one. A setting's value is the lowered one
    (`t.config`, defaults included); whether a flag is passed depends on what the spec says."""
    settings = t.written()
    estimator, loss = openrlhf_algorithm(algorithm, settings)
    cfg = lowered(t)
    flags: list[tuple[str, list[str]]] = [
        ("--algo.advantage.estimator", [estimator]),
        ("--actor.policy_loss_type", [loss]),
        ("--rollout.n_samples_per_prompt", [str(group)]),
        ("--eval.n_samples_per_prompt", [str(group)]),  # the agent routes whole groups
        ("--rollout.batch_size", [str(sched.prompts_per_step)]),
        ("--train.batch_size", [str(sched.rollouts_per_step)]),
        ("--train.num_episodes", [str(sched.episodes)]),
        ("--data.max_len", [str(max_len)]),
        ("--reward.clip_range", ["-" + REWARD_CLIP, REWARD_CLIP]),
        ("--train.seed", [str(seed)]),
    ]
    # the role's lowered sampling (ir.Role.resolved_sampling): the IR's defaults under its own
    flags.append(("--rollout.max_new_tokens", [str(int(sampling["max_tokens"]))]))
    flags.append(("--rollout.temperature", [_num(sampling["temperature"])]))
    if sampling.get("top_p") is not None:
        flags.append(("--rollout.top_p", [_num(sampling["top_p"])]))
    if "lr" in settings:
        flags.append(("--actor.adam.lr", [_num(cfg.lr)]))
    warmup = cfg.warmup
    flags.append(("--actor.lr_warmup_ratio", [_num(min(1.0, warmup / sched.steps) if warmup else 0)]))
    # The optimiser as askspec's own trainer runs it, defaults included: OpenRLHF's differ
    # (cosine decay to 10%, β2 0.95), and a job should train as a local run of the same spec.
    if cfg.decay == "cosine":
        flags += [("--actor.lr_scheduler", ["cosine_with_min_lr"]),
                  ("--actor.min_lr_ratio", [_num(lr_schedule(cfg)["floor"])])]
    else:
        flags.append(("--actor.lr_scheduler", ["constant_with_warmup"]))
    flags += [("--actor.adam.betas", [_num(cfg.beta1), _num(cfg.beta2)]),
              ("--actor.adam.weight_decay", [_num(cfg.weight_decay)]),
              ("--actor.max_norm", [_num(cfg.grad_clip)])]
    # the lowered aggregation, the algorithm's default included (grpo's is `sequence`, OpenRLHF's token-mean)
    if cfg.aggregation in LOSS_AGGREGATION and (cfg.aggregation != "token" or "aggregation" in settings):
        flags.append(("--actor.loss_agg_mode", [LOSS_AGGREGATION[cfg.aggregation]]))
    if "clip_low" in settings or "clip_high" in settings or loss == "cispo":  # cispo's defaults are not OpenRLHF's
        flags.append(("--actor.eps_clip_low_high", [_num(cfg.clip_low), _num(cfg.clip_high)]))
    elif "clip" in settings:
        flags.append(("--actor.eps_clip", [_num(settings["clip"])]))
    flags.append(("--algo.kl.init_coef", [_num(cfg.kl)]))
    if cfg.kl > 0 and estimator != "gae":  # GRPO-style: KL as a loss term, not a reward penalty
        flags += [("--algo.kl.use_loss", []), ("--algo.kl.estimator", [cfg.kl_estimator])]
    return flags


def extension(algorithm: str, t: ir.Training, gated: bool) -> dict[str, Any]:
    """What a phase's job asks of the askspec_ext it ships (job.json's `extension`; empty:
    the job runs OpenRLHF as it is and ships none): `policy_loss` (a loss OpenRLHF lacks),
    `advantage_std` = population (`std = population` where the estimator divides by a std:
    OpenRLHF's group_norm takes the sample std), `advantages` (the block's estimator and
    std: every RL job computes askspec's advantages over askspec's groups, dropped, failed
    and unrewarded rollouts left out, as the local trainer does), `update_gate` (the block's
    `update_when`, for a phase of the RL schedule: a retrain stage updates every step, as
    askspec's own trainer does), `lr_schedule` (every RL job: the role's warm-up and decay
    over its whole schedule, askspec_ext/schedule.py) and `prompt_order` (every RL job: its
    prompts read in the order written, askspec_ext/sequential.py)."""
    estimator, loss = openrlhf_algorithm(algorithm, t.written())
    out: dict[str, Any] = {}
    if loss in EXTENSION_LOSSES:
        out["policy_loss"] = loss
    if lowered(t).std == "population" and estimator == "group_norm":
        out["advantage_std"] = "population"
    if estimator != "gae" and lowered(t).estimator is not None:  # askspec's advantages (askspec_ext/advantages.py)
        out["advantages"] = {"estimator": lowered(t).estimator, "std": lowered(t).std}
    if gated and t.update_when is not None:
        out["update_gate"] = True
    # the learning rate of every optimizer step as the local trainer's, over the role's whole
    # schedule (askspec_ext/schedule.py; OpenRLHF lays its schedule over one launch's steps)
    out["lr_schedule"] = lr_schedule(lowered(t))
    # the prompts in the order the job wrote them, the local steps' groups (askspec_ext/sequential.py)
    out["prompt_order"] = "sequential"
    return out


def _num(x) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


def openrlhf_algorithm(algorithm: str, args: dict) -> tuple[str, str]:
    """(--algo.advantage.estimator, --actor.policy_loss_type) of a supported algorithm,
    with the block's own `estimator` argument when it gives one (ppo, gspo, cispo)."""
    estimator, loss = ALGORITHMS[algorithm]
    if args.get("estimator") in ESTIMATORS:
        estimator = ESTIMATORS[args["estimator"]]
    return estimator, loss


def lowered(t: ir.Training) -> ir.TrainSettings:
    """The block's settings with askspec's defaults, as the compiler lowered them."""
    if t.config is None:
        raise ValueError(f"train {t.role}: the IR holds no lowered training settings (compile the spec first)")
    return t.config


def setting_flags(t: ir.Training) -> list[tuple[str, list[str]]]:
    """The train_ppo_ray flags of the settings training_flags leaves to this function:
    checkpoints (askspec's defaults when the block leaves them out, since OpenRLHF's keep
    no intermediate checkpoint), and the ones written only when the block gives them."""
    given, cfg = t.given, lowered(t)
    # OpenRLHF's global step is one per rollout batch, which is one askspec step (schedule())
    flags: list[tuple[str, list[str]]] = [("--ckpt.save_steps", [str(cfg.save_every)]),
                                          ("--ckpt.max_num", [str(cfg.keep_checkpoints)])]
    if "micro_batch" in given:
        flags.append(("--train.micro_batch_size", [str(cfg.micro_batch)]))
    if "epochs" in given:
        flags.append(("--train.max_epochs", [str(cfg.epochs)]))
    if cfg.dual_clip is not None:
        flags.append(("--actor.dual_clip", [_num(cfg.dual_clip)]))
    if "dtype" in given and cfg.dtype in DTYPES:
        flags.append(("--ds.param_dtype", [DTYPES[cfg.dtype]]))
    if cfg.max_staleness > 0:
        # OpenRLHF's async trainer: the sampler runs up to async_queue_size rollout batches ahead of
        # the update; its token-level TIS weights each token by π_train/π_rollout clipped to
        # [0, is_bound], as the local trainer's correction does
        flags += [("--train.async_enable", []), ("--train.async_queue_size", [str(cfg.max_staleness)]),
                  ("--algo.advantage.is_correction_level", ["token"]),
                  ("--algo.advantage.is_correction_mode", ["clip"]),
                  ("--algo.advantage.is_correction_threshold", ["0", _num(cfg.is_bound)])]
    return flags


def sft_flags(opts: dict, t: ir.Training, max_len: int, seed: int) -> list[tuple[str, list[str]]]:
    """The train_sft flags of an `sft` stage (`opts`, its IR options) of the role trained
    by `t`: one pass over a data set of exactly steps x batch records (`batch` records per
    optimizer step), in OpenRLHF's chat format (messages under `prompt` and `completion`),
    trained as askspec's own trainer trains the stage (runtime/train/stages.py,
    sft_config): the stage's lr (default the role's), constant, no warm-up, and the role's
    AdamW settings with askspec's defaults."""
    cfg = lowered(t)
    return [("--data.input_key", ["prompt"]), ("--data.output_key", ["completion"]),
            ("--data.apply_chat_template", []), ("--data.max_len", [str(max_len)]),
            ("--train.batch_size", [str(int(opts["batch"]))]), ("--train.max_epochs", ["1"]),
            ("--train.seed", [str(seed)]), ("--adam.lr", [_num(opts.get("lr") or cfg.lr)]),
            ("--adam.betas", [_num(cfg.beta1), _num(cfg.beta2)]),
            ("--adam.weight_decay", [_num(cfg.weight_decay)]), ("--max_norm", [_num(cfg.grad_clip)]),
            ("--lr_scheduler", ["constant_with_warmup"]), ("--lr_warmup_ratio", ["0"])]
