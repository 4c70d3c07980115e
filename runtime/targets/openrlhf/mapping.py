"""What askspec's training vocabulary means in OpenRLHF 0.11.2: algorithms, training
settings and model names, as tables and pure functions over the IR (no I/O).

The algorithm table is the one in docs/cluster.md; a test keeps them in step."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
    "ppo": ("gae", "ppo"),
}

# algorithms OpenRLHF 0.11.2 lacks -> (what is missing, nearest supported algorithm or None)
MISSING: dict[str, tuple[str, str | None]] = {
    "sft": ("supervised fine-tuning is not a PPO-family job in OpenRLHF 0.11.2 (it is `openrlhf.cli.train_sft` "
            "on a fixed data set, with no agent)", None),
}

# estimators whose baseline is the prompt group: they need n_samples_per_prompt > 1
GROUPED_ESTIMATORS = {"group_norm", "rloo", "reinforce_baseline", "dr_grpo"}

# training settings the OpenRLHF target maps (the rest are refused, never ignored)
SETTINGS = ("group", "lr", "steps", "batch", "kl", "warmup", "clip", "clip_low", "clip_high", "max_len",
            "decay", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip", "aggregation")

# `aggregation` values OpenRLHF 0.11.2 has (--actor.loss_agg_mode); Dr. GRPO's `constant` is not one
LOSS_AGGREGATION = {"token": "token-mean", "sequence": "seq-mean-token-mean"}

# packaged model names -> the Hugging Face repository vLLM and DeepSpeed load
HF_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}

# OpenRLHF clips rewards to [-10, 10] by default; the contract sums rewards unclipped, so
# the job widens the range (a literal integer: argparse reads "-1e9" as an option name)
REWARD_CLIP = "1000000000"

# room for the prompts and the other roles' messages in the trained role's sequence
CONTEXT_ALLOWANCE = 4096


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


def schedule(elements: int, group: int, batch: int | None, steps: int | None) -> Schedule:
    """OpenRLHF runs floor(elements * group / train_batch) steps per episode; askspec's
    `batch` counts rollouts per optimizer step and `steps` optimizer steps."""
    notes = []
    if batch is None:
        prompts = min(elements, 16)
    else:
        prompts = max(1, math.ceil(batch / group))
        if prompts * group != batch:
            notes.append(f"batch = {batch} is not a multiple of the group ({group}): "
                         f"each step uses {prompts * group} rollouts")
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


def training_flags(algorithm: str, hyper: dict, args: dict, group: int, sched: Schedule, sampling: dict,
                   max_len: int, seed: int) -> list[tuple[str, list[str]]]:
    """The train_ppo_ray flags a job derives from its `train` block (in launch order).
    `algorithm` is the effective (supported) one."""
    estimator, loss = ALGORITHMS[algorithm]
    settings = {**hyper, **args}
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
    if "max_tokens" in sampling:
        flags.append(("--rollout.max_new_tokens", [str(int(sampling["max_tokens"]))]))
    flags.append(("--rollout.temperature", [_num(sampling.get("temperature", 1.0))]))
    if sampling.get("top_p") is not None:
        flags.append(("--rollout.top_p", [_num(sampling["top_p"])]))
    if "lr" in settings:
        flags.append(("--actor.adam.lr", [_num(settings["lr"])]))
    warmup = settings.get("warmup")
    flags.append(("--actor.lr_warmup_ratio", [_num(min(1.0, warmup / sched.steps) if warmup else 0)]))
    # The optimiser as askspec's own trainer runs it, defaults included: OpenRLHF's differ
    # (cosine decay to 10%, β2 0.95), and a job should train as a local run of the same spec.
    if settings.get("decay", "constant") == "cosine":
        lr = float(settings.get("lr", 1e-6))
        flags += [("--actor.lr_scheduler", ["cosine_with_min_lr"]),
                  ("--actor.min_lr_ratio", [_num(float(settings.get("min_lr", 0.0)) / lr if lr else 0)])]
    else:
        flags.append(("--actor.lr_scheduler", ["constant_with_warmup"]))
    flags += [("--actor.adam.betas", [_num(settings.get("beta1", 0.9)), _num(settings.get("beta2", 0.999))]),
              ("--actor.adam.weight_decay", [_num(settings.get("weight_decay", 0.0))]),
              ("--actor.max_norm", [_num(settings.get("grad_clip", 1.0))])]
    if settings.get("aggregation") in LOSS_AGGREGATION:
        flags.append(("--actor.loss_agg_mode", [LOSS_AGGREGATION[settings["aggregation"]]]))
    if "clip_low" in settings or "clip_high" in settings or loss == "cispo":  # cispo's defaults are not OpenRLHF's
        default = settings.get("clip", 0.2)
        flags.append(("--actor.eps_clip_low_high", [_num(settings.get("clip_low", default)),
                                                   _num(settings.get("clip_high", default))]))
    elif "clip" in settings:
        flags.append(("--actor.eps_clip", [_num(settings["clip"])]))
    kl = float(settings.get("kl", 0.0) or 0.0)
    flags.append(("--algo.kl.init_coef", [_num(kl)]))
    if kl > 0 and estimator != "gae":  # GRPO-style: KL as a loss term (k3), not a reward penalty
        flags += [("--algo.kl.use_loss", []), ("--algo.kl.estimator", ["k3"])]
    return flags


def _num(x) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)
