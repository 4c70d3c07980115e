"""The game-graph IR: plain typed data (pydantic) that the runtime executes.

The IR is the only contract between compiler and runtime. Every node carries the span
of the `.ask` text it came from so runtime errors can point back at the spec. Spans are
excluded from the canonical JSON used for the content hash, so reformatting a spec never
changes its experiment hash.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .vocab import (SAMPLING_DEFAULTS, AdvantageStd, Aggregation, Backend, Decay, Estimator, KlEstimator, Loss,
                    MismatchAction, ParserKind, StageKind, TrainDtype)


class Span(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)
    file: str
    line: int
    col: int
    end_line: int
    end_col: int


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    span: Span | None = None


# ---- expressions ---------------------------------------------------------------------
class Lit(Node):
    kind: Literal["lit"] = "lit"
    value: Any
    type: str  # number | bool | string | outcome | list | record


class Ref(Node):
    kind: Literal["ref"] = "ref"
    name: str
    scope: Literal["var", "param", "role", "item", "data", "buffer"]  # data/buffer: a declared data set or buffer


class GetAttr(Node):
    kind: Literal["attr"] = "attr"
    obj: "Expr"
    name: str


class GetIndex(Node):
    kind: Literal["index"] = "index"
    obj: "Expr"
    index: "Expr"


class CallFn(Node):
    kind: Literal["call"] = "call"
    fn: str
    args: list["Expr"] = Field(default_factory=list)
    kwargs: dict[str, "Expr"] = Field(default_factory=dict)
    site: str = ""  # stable id of the call site, for stateful built-ins (diversity, novelty)


class UnaryOp(Node):
    kind: Literal["unary"] = "unary"
    op: Literal["-", "not"]
    operand: "Expr"


class BinaryOp(Node):
    kind: Literal["binary"] = "binary"
    op: str
    left: "Expr"
    right: "Expr"


class CaseArm(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    when: "Expr"
    then: "Expr"


class CaseOf(Node):
    kind: Literal["case"] = "case"
    subject: "Expr | None" = None
    arms: list[CaseArm]
    default: "Expr | None" = None


class ListOf(Node):
    kind: Literal["list"] = "list"
    items: list["Expr"]


class RecordOf(Node):
    kind: Literal["record"] = "record"
    fields: dict[str, "Expr"]


class Filter(Node):
    """`seq where cond`: names in cond resolve to the item's fields first."""

    kind: Literal["where"] = "where"
    seq: "Expr"
    cond: "Expr"


Expr = Annotated[
    Union[Lit, Ref, GetAttr, GetIndex, CallFn, UnaryOp, BinaryOp, CaseOf, ListOf, RecordOf, Filter],
    Field(discriminator="kind"),
]


# ---- steps ---------------------------------------------------------------------------
class AskStep(Node):
    """Ask one or more roles (in parallel). `targets[i]` receives role i's reply record;
    with `sample` each target receives a list of `sample` replies."""

    kind: Literal["ask"] = "ask"
    roles: list[str]
    targets: list[str | None]
    sample: Expr | None = None
    template: str | None = None  # key into Experiment.templates
    message: Expr | None = None  # data sent as the user message verbatim
    context: Expr | None = None  # `with {...}`: extra template variables
    # `with sampling {...}`: sampling fields (askspec.ir.vocab.SAMPLING_FIELDS) over the
    # role's for this ask's calls only, recovery turns included
    sampling: dict[str, int | float | list[str]] = Field(default_factory=dict)
    # `with sampling { ROLE { ... } }`: one role's fields over `sampling` (None: no role has
    # its own; left out of the hash while unset, askspec.ir.canonical)
    role_sampling: dict[str, dict[str, int | float | list[str]]] | None = None

    def sampling_for(self, role: str) -> dict[str, int | float | list[str]]:
        """The sampling fields this ask sets for `role`: the shared ones, its own over them."""
        own = (self.role_sampling or {}).get(role)
        return {**self.sampling, **own} if own else self.sampling


class AssignStep(Node):
    kind: Literal["assign"] = "assign"
    name: str
    value: Expr


class OutcomeStep(Node):
    kind: Literal["outcome"] = "outcome"
    value: Expr


class RepeatStep(Node):
    kind: Literal["repeat"] = "repeat"
    var: str | None = None
    start: Expr
    stop: Expr  # inclusive
    bound: int  # static upper bound on iterations
    body: list["Step"]


class WhileStep(Node):
    kind: Literal["while"] = "while"
    cond: Expr
    until: bool = False
    limit: int
    body: list["Step"]


class ForStep(Node):
    kind: Literal["for"] = "for"
    names: list[str]
    iter: Expr
    limit: int
    body: list["Step"]


class Branch(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    cond: Expr
    body: list["Step"]


class IfStep(Node):
    kind: Literal["if"] = "if"
    branches: list[Branch]
    orelse: list["Step"] = Field(default_factory=list)


class RewardStep(Node):
    """A reward for `role`: terminal when `turn_var` is None, otherwise attached to the
    turn whose reply is held in variable `turn_var`."""

    kind: Literal["reward"] = "reward"
    role: str
    turn_var: str | None = None
    name: str
    value: Expr


class BindStep(Node):
    kind: Literal["bind"] = "bind"
    role: str
    model: Expr  # evaluates to a model name (declared) or "backend:weights"


class EndStep(Node):
    kind: Literal["end"] = "end"
    outcome: str | None = None


class DropStep(Node):
    """Exclude turns from training (they are still recorded, with any rewards): the turn(s)
    held in variable `turn_var` (a reply or a list of replies), or, when `turn_var` is None,
    every turn of `role` in this session."""

    kind: Literal["drop"] = "drop"
    role: str
    turn_var: str | None = None


class PushStep(Node):
    """Append the record `value` to buffer `buffer`."""

    kind: Literal["push"] = "push"
    buffer: str
    value: Expr


Step = Annotated[
    Union[AskStep, AssignStep, OutcomeStep, RepeatStep, WhileStep, ForStep, IfStep, RewardStep, BindStep, EndStep,
          DropStep, PushStep],
    Field(discriminator="kind"),
]


# ---- declarations --------------------------------------------------------------------
class Param(Node):
    name: str
    type: str
    value: Any


class Model(Node):
    name: str
    backend: Backend
    weights: str
    sampling: dict[str, Any] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)
    derived_from: str | None = None
    # `current(role)`: this model serves the trained role's current weights (its backend and
    # weights are the role's model's) under its own sampling settings
    weights_of: str | None = None


class Template(Node):
    name: str
    source: str
    path: str | None = None  # relative to the spec file, when loaded from a file
    variables: list[str] = Field(default_factory=list)


def template_label(key: str, span: Span | None) -> str:
    """How a message names a template: an inline one by where the spec writes it (its key,
    ``inline:<hash>``, says nothing a reader can find), a file by its path, a named one by
    its name and place. ``span`` is the template's IR span (the literal or file(...) call)."""
    kind, _, name = key.partition(":")
    where = f"{span.file}:{span.line}:{span.col}" if span is not None else None
    if kind == "inline":
        return f"inline template at {where}" if where else "inline template"
    if kind == "file":
        return f"template {name}"
    if kind == "named":
        return f"template '{name}' ({where})" if where else f"template '{name}'"
    return f"template {key}"


class ReplyParser(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    kind: ParserKind = "text"
    args: dict[str, Any] = Field(default_factory=dict)
    fields: list[str] = Field(default_factory=list)
    required: list[str] = Field(default_factory=list)


class Recovery(BaseModel):
    """What happens when a reply lacks a required field. mode "prompt": send the
    `truncated` or `malformed` template as a follow-up turn; mode "resample": discard the
    reply and sample the same prompt again (rejection sampling). At most `retries` times."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    mode: Literal["prompt", "resample"] = "prompt"
    truncated: str | None = None  # template keys
    malformed: str | None = None
    retries: int = 0


class Memory(BaseModel):
    """What a role's calls are sent besides the new message: `full` its whole conversation,
    `window` the last `size` exchanges, `none` nothing, `shared` the session's conversation
    `conversation`, which every role naming it adds its turns to (each role sees its own
    turns as assistant messages, the others' as user messages tagged with the speaker)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    kind: Literal["full", "none", "window", "shared"] = "full"
    size: int = 0
    conversation: str | None = None  # with kind "shared"; left out of the hash when None (canonical.py)


class PromptOverflow(BaseModel):
    """What happens to a prompt over a role's `max_prompt_tokens`: "truncate_left" cuts
    tokens from the start of the new message until the prompt fits; "end" ends the session
    with `outcome` before the call."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    mode: Literal["truncate_left", "end"]
    outcome: str | None = None


class Role(Node):
    name: str
    model: str | None = None
    trained: bool = False
    memory: Memory = Field(default_factory=Memory)
    system: str | None = None
    prompt: str | None = None
    reply: ReplyParser = Field(default_factory=ReplyParser)
    recover: Recovery = Field(default_factory=Recovery)
    max_tokens: int | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    # the role's sampling on its declared model, lowered (`merged_sampling`): what a call
    # sends before an ask's own `with sampling` and a run's --max-tokens cap; a role bound
    # per session (no model of its own): the defaults and its own fields. Empty in an IR
    # written before it.
    resolved_sampling: dict[str, Any] = Field(default_factory=dict)
    # a cap on the tokens of a prompt that opens the role's conversation (a call with
    # nothing remembered), counted with the backend's tokenizer; left out of the hash when
    # None (canonical.py)
    max_prompt_tokens: int | None = None
    prompt_overflow: PromptOverflow | None = None


def merged_sampling(defaults: Mapping[str, Any], model_sampling: Mapping[str, Any], role: Role) -> dict[str, Any]:
    """`role`'s sampling fields on a model whose own are `model_sampling`: the IR's defaults
    (`Experiment.sampling_defaults`), the model's over them, the role's over those, its
    `max_tokens` last. The one rule: the compiler lowers each role's on its declared model
    into `Role.resolved_sampling` (what a job and an estimate read); the engine applies it
    to the model a run binds the role to (`--model` may bind another), then an ask's own
    fields and the run's cap (runtime/engine/calls.py)."""
    out = {**defaults, **model_sampling, **role.sampling}
    if role.max_tokens is not None:
        out["max_tokens"] = role.max_tokens
    return out


class Dataset(Node):
    """A data set: a file (`path` relative to the spec's folder, `digest` the sha256 of its
    content when compiled) or inline `items`."""

    name: str
    format: Literal["jsonl", "parquet", "list", "knowledge"]
    path: str | None = None
    digest: str | None = None
    items: list[Any] | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    # `jsonl(...) where COND`: the records COND holds for are the data set (COND names the
    # record's fields, `it` the record, and the parameters in `filter_params`, their values)
    filter: Expr | None = None
    filter_params: dict[str, Any] = Field(default_factory=dict)
    # `--data NAME=FILE`: `path` is the user's file (absolute), read where it is rather than
    # inside the spec's folder (None: the spec's own; left out of the hash while unset)
    user_file: bool | None = None


class Buffer(Node):
    """A bounded store of records filled by `push` and replayed by games that iterate over
    it (circularly). `eviction`: oldest (only when full), none, solved, no_peak,
    solved_or_no_peak; `score` names the session variable of a replaying game that holds
    the replay's accuracy (needed by solved / no_peak eviction); `patience` is the c of
    no_peak. `fields` is the record type of the items (field -> type name)."""

    name: str
    capacity: int
    eviction: str = "oldest"
    fields: dict[str, str] = Field(default_factory=dict)
    score: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class Tournament(Node):
    name: str
    judge: str
    template: str
    pairing: Literal["round_robin", "live"] = "live"
    live_opponents: list[str] = Field(default_factory=lambda: ["best", "worst", "median"])
    verdicts: list[str] = Field(default_factory=lambda: ["A", "B", "Tie"])
    gamma: float = 1.0
    # None: the paper's pairing default (round robin -> win rate, live -> Bradley-Terry)
    aggregate: Literal["win_rate", "bradley_terry"] | None = None
    order: Literal["random", "both", "fixed"] = "random"  # presentation order of each judged pair
    retries: int = 2


class PointwiseJudge(Node):
    name: str
    judge: str
    template: str
    scores: list[float] = Field(default_factory=lambda: [0.0, 0.5, 1.0])
    retries: int = 2


class RouteArm(Node):
    cond: Expr | None = None
    action: Literal["keep", "drop", "resample", "tournament", "judge"]
    target: str | None = None


class Route(Node):
    role: str
    arms: list[RouteArm]


class Game(Node):
    name: str
    pattern: list[str] = Field(default_factory=list)
    iter: Expr | None = None
    times: int = 1
    group_size: int = 1
    outcomes: list[str] = Field(default_factory=list)
    body: list[Step]
    routes: list[Route] = Field(default_factory=list)
    call_bounds: dict[str, int] = Field(default_factory=dict)


class TrainSettings(BaseModel):
    """A train block's settings as the trainer runs them, lowered by the compiler
    (askspec/lang/training.py, `lower_training`): every default filled in, the algorithm
    resolved into an advantage estimator, a policy loss and an aggregation, and `steps`
    resolved against the schedule. It is part of the experiment hash, so a changed default
    changes the hash (and `--resume` refuses the run)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    estimator: Estimator | None  # None for sft
    loss: Loss
    aggregation: Aggregation
    clip_low: float
    clip_high: float
    dual_clip: float | None
    min_reward: float | None
    group: int | None  # the block's `group`; a `sample N` game's N wins (plansize.group_size)
    steps: int  # the learning-rate schedule's length (plansize.training_steps)
    batch: int | None
    micro_batch: int
    epochs: int
    lr: float
    warmup: int
    decay: Decay
    min_lr: float
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float
    kl: float
    kl_estimator: KlEstimator
    std: AdvantageStd  # the group std grpo and group_norm divide by
    save_every: int
    keep_checkpoints: int
    max_nonfinite_steps: int
    max_staleness: int  # 0: on-policy; K: rollouts sampled up to K updates before the trained weights
    is_bound: float  # truncation of a stale token's importance weight
    # an on-policy step whose sampler-trainer KL exceeds max_mismatch (None: vocab.MAX_MISMATCH
    # of the training precision): warn, or stop the run (defaults here too: an IR written
    # before them still reads)
    max_mismatch: float | None = None
    on_mismatch: MismatchAction = "warn"
    dtype: TrainDtype
    replay: str | None


class Training(Node):
    """A train block, lowered: `config` holds the settings the trainer runs (every default
    filled in; None only in an IR written before settings were lowered, such as an old
    run's ir.json), `given` the names of the settings and algorithm arguments the spec
    writes, so a target can tell a written value from a default (it passes a flag only
    for what the spec says). The values the spec wrote are `written()`: what the compiler
    lowered them to, read back from `config`."""

    role: str
    algorithm: str
    given: list[str] = Field(default_factory=list)  # sorted
    update_when: Expr | None = None  # the online gate: a yes/no over the step's sessions (metric scope)
    config: TrainSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_written_settings(cls, data: Any) -> Any:
        # an IR written before the block was lowered whole kept the spec's settings as written,
        # under `algorithm_args` and `hyper`: their names are what it gave
        if isinstance(data, dict) and ("hyper" in data or "algorithm_args" in data):
            data = dict(data)
            written = {**(data.pop("hyper", None) or {}), **(data.pop("algorithm_args", None) or {})}
            data.setdefault("given", sorted(written))
        return data

    def written(self) -> dict[str, Any]:
        """The settings and algorithm arguments the spec gives, by name, as lowered (`clip`
        is the side of the ratio clip no `clip_low`/`clip_high` overrides)."""
        if self.config is None:
            return {}
        cfg = self.config
        out: dict[str, Any] = {}
        for name in self.given:
            if name == "clip":
                out[name] = cfg.clip_low if "clip_high" in self.given else cfg.clip_high
            else:
                out[name] = getattr(cfg, name)
        return out


class Schedule(Node):
    kind: Literal["online", "alternating", "nested"]
    options: dict[str, Any] = Field(default_factory=dict)


class Stage(Node):
    """One stage of `stages`, run in declaration order (docs/training.md, "Stages").
    sft: {role, data, steps, batch, lr, prompt, completion}; train: {} (the spec's train
    blocks and schedule); evaluate: {games, samples, k, score, weights}; retrain: {role,
    game, promoted, data, steps, curriculum, warmup?, lr?}."""

    name: str
    kind: StageKind
    options: dict[str, Any] = Field(default_factory=dict)


class TrainPhase(BaseModel):
    """One phase of the training schedule, lowered by the compiler (askspec/lang/phases.py):
    the roles it updates, the games it plays and how many sessions of each. The runtime
    lists its steps from these (runtime/train/schedule.py) and plans them with these sizes;
    an OpenRLHF job's step shape is read from them too.

    - `groups`: each game the phase plays -> the sessions of one group (a `sample N` game's
      N, else the largest `group` of the phase's train blocks, 1 without one).
    - `batch`: the sessions a step of its plain games plays at least: elements are taken in
      plan order, cycling, a whole group each, until they reach it (the largest `batch` of
      the phase's train blocks; one group of its first game without one). A retrain
      phase and the inner loop play one game (`groups`' one key, `plain` empty) over
      items they are given: `batch` is their step's sessions, in whole groups.
    - `replay_items`: each game replaying a buffer -> the items one step takes from it
      (`batch` in whole groups of the game's group, one group without `batch`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    name: str  # "online", an alternating phase's role, "outer"/"inner" (nested), or the stage's name
    kind: Literal["play", "sft", "evaluate", "retrain", "inner"] = "play"
    stage: str | None = None  # the stage it belongs to, when the spec declares stages
    roles: tuple[str, ...] = ()  # roles updated in this phase
    plain: tuple[str, ...] = ()  # games planned from their data (cycling)
    replay: tuple[str, ...] = ()  # games replaying a buffer
    steps: int = 1
    groups: dict[str, int] = Field(default_factory=dict)
    batch: int = 1
    replay_items: dict[str, int] = Field(default_factory=dict)


class PhaseCycle(BaseModel):
    """Phases run in order, the whole cycle `iterations` times (an alternating schedule's
    `iterations`; 1 otherwise)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    phases: list[TrainPhase]
    iterations: int = 1


class Metric(Node):
    name: str
    value: Expr
    by: list[str] = Field(default_factory=list)


class Experiment(Node):
    ir_version: int = 1
    name: str
    options: dict[str, Any] = Field(default_factory=dict)
    params: list[Param] = Field(default_factory=list)
    models: list[Model] = Field(default_factory=list)
    roles: list[Role] = Field(default_factory=list)
    templates: dict[str, Template] = Field(default_factory=dict)
    datasets: list[Dataset] = Field(default_factory=list)
    buffers: list[Buffer] = Field(default_factory=list)
    tournaments: list[Tournament] = Field(default_factory=list)
    judges: list[PointwiseJudge] = Field(default_factory=list)
    games: list[Game] = Field(default_factory=list)
    training: list[Training] = Field(default_factory=list)
    schedule: Schedule | None = None
    stages: list[Stage] = Field(default_factory=list)
    metrics: list[Metric] = Field(default_factory=list)
    # vocab.SAMPLING_DEFAULTS as compiled: what a call uses for a field nothing in the spec sets
    # (in the hash, so a changed default refuses a resume); empty in an IR written before it
    # (the runtime then uses the vocabulary's, the values those runs were played with)
    sampling_defaults: dict[str, float | int] = Field(default_factory=dict)
    # the training schedule lowered (askspec/lang/phases.py): its cycles in order (one per stage
    # that trains or evaluates; one without stages), and a nested schedule's inner loop. Empty
    # without train blocks, and in an IR written before schedules were lowered.
    train_cycles: list[PhaseCycle] = Field(default_factory=list)
    inner_phase: TrainPhase | None = None

    # lookups used by the runtime
    def train_phases(self) -> list[TrainPhase]:
        """Every lowered phase of the schedule, cycle by cycle (each once)."""
        return [ph for c in self.train_cycles for ph in c.phases]

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def model(self, name: str) -> Model | None:
        return next((m for m in self.models if m.name == name), None)

    def param_values(self) -> dict[str, Any]:
        return {p.name: p.value for p in self.params}

    def default_max_tokens(self) -> int:
        """The completion budget of a call whose model, role and ask set none: the IR's
        default (the vocabulary's for an IR compiled before the defaults were in it)."""
        return int((self.sampling_defaults or SAMPLING_DEFAULTS)["max_tokens"])


for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, BaseModel) and _cls is not BaseModel:
        _cls.model_rebuild()
