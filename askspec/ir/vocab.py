"""The vocabulary of a spec, defined once: the kinds of backend, reply parser, sampling
field, stage, advantage estimator, policy loss and aggregation, with their fields. The
checker validates against these tables, the IR types its fields with them, the runtime
dispatches on them and targets map from them; none of them defines its own list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

# ---- models ----------------------------------------------------------------------------
Backend = Literal["hf", "openai", "vllm", "python", "replay"]
BACKENDS: tuple[str, ...] = get_args(Backend)
HF_WEIGHTS_BACKENDS = ("hf", "vllm")  # their weights are a Hugging Face model (vLLM serves it, OpenRLHF trains it)

# Sampling fields a model or role may set -> the type a backend sends (int: a whole
# number); `stop` (a list of strings) is the one field that is not a number.
SAMPLING_NUMBERS: dict[str, type] = {"temperature": float, "top_p": float, "top_k": int, "min_p": float,
                                     "presence_penalty": float, "repetition_penalty": float, "max_tokens": int,
                                     "seed": int}
SAMPLING_FIELDS: tuple[str, ...] = (*SAMPLING_NUMBERS, "stop")
# what a model call uses for a field no model, role or ask sets: the compiler copies them into
# the IR (`Experiment.sampling_defaults`, hashed: another default is another experiment)
SAMPLING_DEFAULTS: dict[str, float | int] = {"temperature": 1.0, "max_tokens": 256}
WHOLE_SAMPLING_FIELDS = frozenset(k for k, t in SAMPLING_NUMBERS.items() if t is int)


# ---- reply parsers ---------------------------------------------------------------------
ParserKind = Literal["text", "sections", "boxed", "summary", "json", "tags"]


@dataclass(frozen=True)
class Parser:
    """A reply parser: the arguments it takes (the spec's and the IR's names) and, for the
    parsers whose fields do not depend on their arguments, the fields and the required ones."""

    args: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    required: tuple[str, ...] = ()


SUMMARY_TAGS: tuple[str, ...] = ("#Summary#", "#Output#")  # summary()'s `after` when the spec gives none
SUMMARY_MAX_CHARS = 2000
SUMMARY_KEEP = ("boxed", "none")  # the first is the default
JSON_RETRIES = 2  # json()'s `retries` when the spec gives none

PARSERS: dict[str, Parser] = {
    "text": Parser(),
    "boxed": Parser(fields=("answer",), required=("answer",)),
    "sections": Parser(args=("tags",)),  # fields: one per tag, the last required
    "summary": Parser(args=("after", "max_chars", "keep"), fields=("summary", "answer")),
    "tags": Parser(args=("tags", "boxed")),  # fields: one per tag (+ answer with boxed), all required
    "json": Parser(args=("schema", "retries")),  # fields: the schema's, all required
}


def tag_field(tag: str) -> str:
    """The field a `sections` or `tags` tag names, the one rule the checker (the IR's
    `fields` and `required`) and the reply parsers (the fields they fill) share: the tag's
    letters, digits and underscores, in lower case (`#Question#` -> `question`,
    `#Final_Answer#` -> `final_answer`, `#Final Answer#` -> `finalanswer`); "" for a tag
    without a letter or digit, which names no field."""
    name = "".join(ch for ch in tag.lower() if ch.isalnum() or ch == "_")
    return name if any(ch.isalnum() for ch in name) else ""


# ---- group routes ----------------------------------------------------------------------
# the routes to a contest: a group routed to one gets the contest's scores as rewards named
# after the route, which replace the verifier's terminal rewards of the role it was routed for
# (the trainer, `askspec metrics`, the TUI and the Inspect export all count them so)
CONTEST_ROUTES: tuple[str, ...] = ("tournament", "judge")


def reward_counts(turn_index: int | None, name: str, routed: bool) -> bool:
    """Whether a recorded reward counts toward its role's final reward (the one rule the
    trainer, `askspec metrics`, the TUI and the Inspect export share; tui/data.py's
    FINAL_REWARDS is its SQL form): a per-turn reward always; a terminal one when it is the
    contest's (its name a contest route) exactly when the session's group was `routed` to a
    contest for the reward's role."""
    return turn_index is not None or (name in CONTEST_ROUTES) == routed


# ---- stages ----------------------------------------------------------------------------
StageKind = Literal["sft", "train", "evaluate", "retrain"]
STAGE_KINDS: tuple[str, ...] = get_args(StageKind)
# `keep`: which of a stage's checkpoints the later stages use. `last` (the default: the
# stage's last step) or a rule -> (the stage kind it applies to, the curve or score it reads,
# its keyword arguments): `best(accuracy)` the nested schedule's promoted student with the
# best accuracy on its reward questions (SOAR's PS); `plateau(reward, window, fraction)` a
# retrain stage's checkpoint where its training reward levels off (SOAR's PQ, App. B.6)
KEEP_LAST = "last"
KEEP_RULES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "best": ("train", "accuracy", ()),
    "plateau": ("retrain", "reward", ("window", "fraction")),
}
# a rule's optional keyword arguments -> their defaults. plateau's `select`: `online` stops
# the stage at the first step the trailing-window rule holds, not before `min_steps`;
# `posthoc` trains every step, keeping the role's weights every `every` steps, and selects
# afterwards over the whole curve with a centred window (App. B.6), the evaluate stages
# after it averaging over the kept checkpoints in the `average` steps from the selected one
KEEP_OPTIONS: dict[str, dict[str, Any]] = {
    "plateau": {"select": "online", "min_steps": 0, "average": 0, "every": 0},
}
PLATEAU_SELECTS: tuple[str, ...] = ("online", "posthoc")


# ---- training --------------------------------------------------------------------------
# advantage estimators (how a trajectory's reward becomes its advantage)
Estimator = Literal["grpo", "dr_grpo", "group_norm", "rloo", "reinforce", "reinforce_baseline"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)
# the group std an estimator divides by (`std` of a train block): sample (Bessel's n − 1, TRL
# and OpenRLHF) or population (n: Reasoning Arena's Eq. 2); the first is the default
AdvantageStd = Literal["sample", "population"]
ADVANTAGE_STDS: tuple[str, ...] = get_args(AdvantageStd)
STD_ESTIMATORS: tuple[str, ...] = ("grpo", "group_norm")  # the estimators that divide by it
Loss = Literal["ppo", "gspo", "cispo", "sft"]  # policy losses
LOSSES: tuple[str, ...] = get_args(Loss)
Aggregation = Literal["token", "sequence", "constant"]  # how token losses become the batch loss
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
Decay = Literal["constant", "cosine"]  # the learning rate after warm-up
DECAYS: tuple[str, ...] = get_args(Decay)
KlEstimator = Literal["k1", "k3"]  # per-token KL: k1 = log π/π_ref, k3 = r − 1 − log r
KL_ESTIMATORS: tuple[str, ...] = get_args(KlEstimator)
TrainDtype = Literal["auto", "float32", "bfloat16"]  # auto: float32 on a CPU, bf16 autocast on a GPU
TRAIN_DTYPES: tuple[str, ...] = get_args(TrainDtype)
# sampler-trainer mismatch of an on-policy step (train_steps.mismatch_kl): the bound past which
# the step is reported (`max_mismatch`; unset: by the training precision) and what happens then
# (`on_mismatch`). On-policy the KL is float noise: ~1e-13 in float32 on a CPU; bf16 kernels
# differ by ~1e-3. A sampler decoding from prompt caches of older weights gave 3e-6 (a tiny
# model, lr 0.003) to 1e-2 (lr 0.03)
MAX_MISMATCH = {"float32": 1e-6, "bfloat16": 1e-3}
MismatchAction = Literal["warn", "error"]
MISMATCH_ACTIONS: tuple[str, ...] = get_args(MismatchAction)

# algorithm -> (estimator, policy loss, aggregation) when the spec does not choose
ALGORITHM_DEFAULTS: dict[str, tuple[Estimator | None, Loss, Aggregation]] = {
    "grpo": ("grpo", "ppo", "sequence"),
    "dr_grpo": ("dr_grpo", "ppo", "constant"),
    "group_norm": ("group_norm", "ppo", "token"),
    "rloo": ("rloo", "ppo", "token"),
    "reinforce": ("reinforce", "ppo", "token"),
    "reinforce_baseline": ("reinforce_baseline", "ppo", "token"),
    "ppo": ("grpo", "ppo", "token"),
    "gspo": ("grpo", "gspo", "sequence"),
    "cispo": ("grpo", "cispo", "token"),
    "sft": (None, "sft", "token"),
}
ALGORITHMS = frozenset(ALGORITHM_DEFAULTS)
