"""Which parts of a compiled spec an OpenRLHF 0.11.2 job can express, as a plan of
phase jobs and stage jobs (sft, evaluate, retrain), and diagnostics (E601-E608, W601,
with spans) for everything it cannot.

Every refusal says what cannot be mapped, why, and the alternative; the checks run to
the end so one compile lists every problem (docs/cluster.md lists them per spec)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from askspec.ir import model as ir
from askspec.ir.plansize import Unknown, const_value, held_out_games
from askspec.ir.vocab import HF_WEIGHTS_BACKENDS
from askspec.ir.walk import all_steps, bodies
from askspec.diagnostics import DiagnosticSink, Sources
from askspec.span import Span

from askspec.runtime.engine.plan import replays_buffer
from askspec.runtime.scoring.buffers import SCORED as SCORED_EVICTIONS
from askspec.runtime.targets.openrlhf.mapping import (ALGORITHMS, DTYPES, GROUPED_ESTIMATORS, LOSS_AGGREGATION,
                                                      MISSING, REFUSED, SETTINGS, lowered, openrlhf_algorithm)

TRAINABLE_BACKENDS = HF_WEIGHTS_BACKENDS


@dataclass
class Phase:
    """One OpenRLHF job: `role` trained on `games`; other trained roles play frozen."""

    role: str
    games: list[str]
    training: ir.Training
    algorithm: str  # effective, supported by OpenRLHF
    substituted: str | None  # the spec's algorithm, when --substitute replaced it
    group: int
    steps: int | None  # optimizer steps of this phase (None: one pass over the elements)
    # games whose group is the N replies of the role's one `sample N ask` in a session (game -> N)
    siblings: dict[str, int] = field(default_factory=dict)
    dir: str = "."  # its folder in the job
    data: str | None = None  # a retrain stage's data set, whose items replace the game's own
    # games whose siblings are several `sample N ask` calls of a session (game -> calls K; the
    # group is their K x N replies): the outer role of a nested schedule, one dataset per call
    sample_calls: dict[str, int] = field(default_factory=dict)
    inner_loop: str | None = None  # the inner role the job's inner-loop service trains (a grounded nested schedule)


@dataclass
class StageJob:
    """One stage of the spec as the job runs it (in the spec's order): `train` is the RL
    schedule's place; `sft` trains `role` with openrlhf.cli.train_sft; `evaluate` serves
    `role`'s weights and plays the stage's games against them (`askspec run --stage`);
    `retrain` is a PPO job (`phase`) from `role`'s initial weights, or with `askspec` a run
    of askspec's own trainer (retrain.sh: `askspec run --stage`)."""

    stage: ir.Stage
    dir: str  # its folder in the job ("" for the train stage)
    role: str | None = None
    phase: Phase | None = None
    # a retrain stage OpenRLHF cannot run (it samples its items from a role, or stops at a reward plateau,
    # or trains on the nested schedule's promoted datasets)
    askspec: bool = False
    # its items include the promoted datasets the job's inner-loop service keeps (retrain.sh: --promotions)
    promotions: bool = False
    # an evaluate stage: the models of its frozen roles that the stage's serve_frozen.sh serves beside the
    # evaluated weights, and the spec's openai models, which keep their own server (askspec run --endpoint)
    frozen: list[str] = field(default_factory=list)
    endpoints: dict[str, str] = field(default_factory=dict)


@dataclass
class JobPlan:
    phases: list[Phase]
    iterations: int = 1  # cycles of the phase sequence (alternating schedules)
    notes: list[str] = field(default_factory=list)
    stages: list[StageJob] = field(default_factory=list)  # empty: the spec declares no stages
    # several trained roles updated in the same step: one multi-policy job (multi.py) steps their phases together
    lockstep: bool = False

    @property
    def driven(self) -> bool:
        """Whether driver.sh runs the job (several phases, or stages around the RL schedule)."""
        return len(self.phases) > 1 or any(s.stage.kind != "train" for s in self.stages)


def span_of(s: ir.Span | None, fallback_file: str) -> Span:
    if s is None:
        return Span(fallback_file, 1, 1, 1, 2)
    return Span(s.file, s.line, s.col, s.end_line, s.end_col)


def _algorithm_span(t: ir.Training, sources: Sources, fallback: str) -> Span:
    """The algorithm's name inside `train R with ALG ...` (the IR keeps the whole span)."""
    whole = span_of(t.span, fallback)
    for n in range(whole.line, whole.end_line + 1):
        line = sources.line(whole.file, n) or ""
        start = whole.col - 1 if n == whole.line else 0
        m = re.compile(r"\bwith\s+(" + re.escape(t.algorithm) + r")\b").search(line, start)
        if m:
            return Span(whole.file, n, m.start(1) + 1, n, m.end(1) + 1)
    return whole


def asks_of(steps: list, role: str, mult: int = 1):
    """(ask step, how many times it can run per session) for every ask of `role`."""
    for s in steps:
        if s.kind == "ask" and role in s.roles:
            yield s, mult
        for times, body in bodies(s):
            yield from asks_of(body, role, mult * times)


def check(exp: ir.Experiment, sources: Sources, spec_file: str, substitutes: dict[str, str],
          sink: DiagnosticSink) -> JobPlan | None:
    """The job plan, or None with the refusals in `sink`."""
    fallback = span_of(None, spec_file)
    if not exp.training:
        sink.error("E607", f"experiment '{exp.name}' has no `train` declaration: an OpenRLHF job trains one role",
                   fallback, "to play the games at scale without training, use `askspec run` with the vllm or "
                         "openai backend (docs/cluster.md)")
        return None
    trainings = {t.role: t for t in exp.training}
    sched = exp.schedule
    nested = sched if sched is not None and sched.kind == "nested" else None
    inner = str(nested.options.get("inner")) if nested is not None else None
    if nested is not None:
        _check_nested(exp, nested, spec_file, sink)

    phases: list[Phase] = []
    for t in exp.training:
        if t.role == inner:  # the inner-loop service trains it with askspec's own trainer
            continue
        _check_settings(t, span_of(t.span, spec_file), sink)
        phase = _check_training(exp, t, sources, spec_file, substitutes, sink)
        if phase is not None:
            phases.append(phase)
    stages = [_check_stage(exp, st, k, sources, spec_file, substitutes, sink) for k, st in enumerate(exp.stages, 1)]
    _check_job_names(exp, sources, spec_file, sink)
    if sink.has_errors:
        return None
    plan = JobPlan(phases=phases, stages=[j for j in stages if j is not None])
    # several roles updated in the same step: one multi-policy job steps them together (multi.py)
    plan.lockstep = lockstep(exp)
    if sched is not None and sched.kind == "online" and "steps" in sched.options:
        for p in phases:  # the block's own `steps` over the schedule's, as the compiler lowered them
            p.steps = lowered(p.training).steps
    if nested is not None and phases:  # the outer role: one session (an outer step's datasets) per step
        if nested.options.get("outer_steps") is not None:
            phases[0].steps = int(nested.options["outer_steps"])
        if str(nested.options.get("outer_reward") or "grounded") == "grounded":
            phases[0].inner_loop = inner
    if sched is not None and sched.kind == "alternating":
        order = [k for k in sched.options if k in trainings]
        plan.phases = sorted(phases, key=lambda p: order.index(p.role) if p.role in order else len(order))
        for p in plan.phases:
            if p.role in sched.options:
                p.steps = int(sched.options[p.role])
        plan.iterations = int(sched.options.get("iterations", 1))
    for k, p in enumerate(plan.phases, 1):
        p.dir = f"phase-{k}-{p.role}" if len(plan.phases) > 1 else "."
    return plan


def lockstep(exp: ir.Experiment) -> bool:
    """Whether the schedule updates several trained roles in the same step (`online`, or
    no schedule, with more than one `train` block): the job is one multi-policy job
    (askspec_ext/multi_policy.py) whose step loop updates every role each step."""
    sched = exp.schedule
    return len({t.role for t in exp.training}) > 1 and (sched is None or sched.kind == "online")


def job_name_key(name: str) -> str:
    """What a trained role's name becomes in the job's files and shell variables: driver.sh's
    CKPT_<ROLE> and PRETRAIN_<ROLE> (upper case, only the characters a shell variable name
    keeps), and its checkpoint and done/ names, which a case-insensitive file system folds."""
    return re.sub(r"[^A-Z0-9_]", "", name.upper())


def _check_job_names(exp: ir.Experiment, sources: Sources, spec_file: str, sink: DiagnosticSink) -> None:
    """E608 at the second of two trained roles whose names the job's files and shell
    variables cannot tell apart (`Solver` and `solver`): one role would train from the
    other's weights, and their checkpoints share a folder on a case-insensitive file system."""
    seen: dict[str, ir.Training] = {}
    for t in exp.training:
        key = job_name_key(t.role)
        first = seen.setdefault(key, t)
        if first is t or first.role == t.role:
            continue
        d = sink.error("E608", f"trained roles '{first.role}' and '{t.role}' name the same job files and shell "
                               f"variables (driver.sh's CKPT_{key}; ckpt/iter-N/{t.role} and ckpt/iter-N/{first.role} "
                               "on a case-insensitive file system): one role would train from the other's weights",
                       _role_span(t, sources, spec_file),
                       "rename one of them so that the names differ in more than letter case")
        d.notes.append((f"'{first.role}' is trained here", _role_span(first, sources, spec_file)))


def _role_span(t: ir.Training, sources: Sources, fallback: str) -> Span:
    """The role's name inside `train ROLE with ...` (the IR keeps the whole span)."""
    whole = span_of(t.span, fallback)
    line = sources.line(whole.file, whole.line) or ""
    m = re.compile(r"\btrain\s+(" + re.escape(t.role) + r")\b").search(line, whole.col - 1)
    return Span(whole.file, whole.line, m.start(1) + 1, whole.line, m.end(1) + 1) if m else whole


def _check_stage(exp: ir.Experiment, stage: ir.Stage, k: int, sources: Sources, spec_file: str,
                 substitutes: dict[str, str], sink: DiagnosticSink) -> StageJob | None:
    """How the job runs a stage, or None when it leaves it out (W601 says why)."""
    o, folder = stage.options, f"stage-{k}-{stage.name}"
    if stage.kind == "train":
        return StageJob(stage, "")
    if stage.kind == "sft":
        return StageJob(stage, folder, role=o["role"])
    if stage.kind == "evaluate":
        owner, why, frozen, endpoints = _evaluated_owner(exp, o["games"])
        if owner is None:
            sink.warn("W601", f"stage '{stage.name}' (evaluate) is not part of the OpenRLHF job: {why}",
                      span_of(stage.span, spec_file), "run it with askspec's own trainer (`askspec run`), with the "
                                                      "job's checkpoints as the trained roles' models")
            return None
        return StageJob(stage, folder, role=owner, frozen=frozen, endpoints=endpoints)
    if o["promoted"]:
        # the promoted datasets are the inner-loop service's (state.json): askspec's trainer reads them
        # there; with no grounded inner loop nothing is promoted, and the stage trains on its data alone
        from askspec.runtime.train.nested import Settings

        grounded = exp.schedule is not None and exp.schedule.kind == "nested" and \
            Settings.of(exp).outer_reward == "grounded"
        return StageJob(stage, folder, role=o["role"], askspec=True, promotions=grounded)
    if o.get("sample") or o.get("keep"):
        # a PPO job can neither play a game before its first step nor stop by its reward's slope:
        # askspec's own trainer runs the stage on the job's node, from the weights the stages before left
        return StageJob(stage, folder, role=o["role"], askspec=True)
    t = next(t for t in exp.training if t.role == o["role"])
    game = next(g for g in exp.games if g.name == o["game"])
    phase = _check_training(exp, _retrained(t, o), sources, spec_file, substitutes, sink, games=[game])
    if phase is None:
        return None
    phase.dir, phase.data, phase.steps = folder, o["data"], int(o["steps"])
    return StageJob(stage, folder, role=o["role"], phase=phase)


def _retrained(t: ir.Training, opts: dict) -> ir.Training:
    """The role's train block as a retrain stage runs it: the stage's steps, warm-up and lr."""
    update: dict = {"steps": int(opts["steps"])}
    for key in ("warmup", "lr"):
        if opts.get(key) is not None:
            update[key] = opts[key]
    config = lowered(t).model_copy(update=update)
    return t.model_copy(update={"config": config, "given": sorted({*t.given, *update})})


def _evaluated_owner(exp: ir.Experiment, games: list[str]) -> tuple[str | None, str, list[str], dict[str, str]]:
    """(the trained role whose weights an evaluate stage's games play, or None and why; the
    models its other roles play that the stage serves with vLLM; the spec's openai models,
    by their own server). Every role its games ask plays that role's weights (the role
    itself, or a `current(role)` model), runs in process (a python model), plays weights
    vLLM serves (an hf or vllm model: a server of its own beside the evaluated weights'), or
    asks the server its openai model names (one base_url, passed on with --endpoint)."""
    trained = {t.role for t in exp.training}
    owners: set[str] = set()
    frozen: list[str] = []
    endpoints: dict[str, str] = {}
    for g in exp.games:
        if g.name not in games:
            continue
        for name in roles_asked(exp, [g]):
            role = exp.role(name)
            model = exp.model(role.model) if role.model else None
            if name in trained:
                owners.add(name)
            elif model is not None and model.weights_of in trained:
                owners.add(model.weights_of)
            elif model is None:
                return None, f"game '{g.name}' asks role '{name}', whose model is bound per session", [], {}
            elif model.backend in HF_WEIGHTS_BACKENDS:
                if model.name not in frozen:
                    frozen.append(model.name)
            elif model.backend == "openai" and isinstance(model.options.get("base_url"), str) and \
                    "{host}" not in model.options["base_url"]:
                endpoints[model.name] = model.options["base_url"]
            elif model.backend != "python":
                return None, (f"game '{g.name}' asks role '{name}' on model '{model.name}' ({model.backend}), which "
                              "the evaluation run cannot reach (no weights to serve, nor one server of its own)"), [], {}
    if len(owners) != 1:
        what = f"the weights of {', '.join(sorted(owners))}" if owners else "no trained role's weights"
        return None, f"its games play {what}: the evaluation run serves one trained role's weights", [], {}
    return owners.pop(), "", frozen, endpoints


def roles_asked(exp: ir.Experiment, games: list[ir.Game]) -> list[str]:
    """The roles `games` ask, and the judges of their routes' contests; not a role asked
    only in a branch the parameters rule out (SOAR's student under `grounded`: no
    server for it)."""
    params = exp.param_values()
    live = {r for g in games for s in _live_asks(g.body, params) for r in s.roles}
    names = [r.name for r in exp.roles if r.name in live]
    contests: list[ir.Tournament | ir.PointwiseJudge] = [*exp.tournaments, *exp.judges]
    for g in games:
        for route in g.routes:
            for arm in route.arms:
                contest = next((c for c in contests if c.name == arm.target), None)
                if contest is not None and contest.judge not in names:
                    names.append(contest.judge)
    return names


def _check_settings(t: ir.Training, tspan: Span, sink: DiagnosticSink) -> None:
    """Every setting the block gives is mapped (mapping.SETTINGS) or refused, naming it."""
    given = t.written()
    if t.update_when is not None:
        given["update_when"] = "..."
    lowered = t.config.aggregation if t.config is not None else None
    if "aggregation" not in given and lowered is not None and lowered not in LOSS_AGGREGATION:
        # the algorithm's own default (dr_grpo's `constant`): the job would train on OpenRLHF's token mean
        sink.error("E604", f"'{t.algorithm}' aggregates its loss by `{lowered}`, which OpenRLHF 0.11.2 has no "
                           f"equivalent of (its loss aggregations: {', '.join(LOSS_AGGREGATION)})", tspan,
                   "set `aggregation = token` or `sequence` in the train block (a different loss than the "
                   "algorithm's own), or train with askspec's own trainer")
    for key, value in given.items():
        if key == "replay":
            sink.error("E605", f"`replay = {value}`: {REFUSED['replay']}", tspan,
                       "train on the games' own elements, or with askspec's own trainer")
        elif key == "aggregation" and value not in LOSS_AGGREGATION:
            sink.error("E604", f"`aggregation = {value}` has no OpenRLHF 0.11.2 equivalent (its loss "
                               f"aggregations: {', '.join(LOSS_AGGREGATION)})", tspan,
                       "aggregate by token or sequence, or train with askspec's own trainer")
        elif key == "dtype" and value not in DTYPES:
            sink.error("E604", f"`dtype = {value}`: OpenRLHF 0.11.2 trains in bf16 or fp16 (--ds.param_dtype)", tspan,
                       "leave dtype out (bf16), or train with askspec's own trainer")
        elif key == "max_staleness" and value and t.config is not None and t.config.loss not in ("ppo", "cispo"):
            # OpenRLHF 0.11.2 weights tokens by its clipped TIS in the ppo loss (and askspec_ext's
            # cispo the same way); gspo takes the sampler's log-probs into its ratio instead
            sink.error("E604", f"`max_staleness = {value}` with the {t.config.loss} loss: OpenRLHF 0.11.2 applies "
                               "its importance-sampling correction (the asynchronous trainer's) to the ppo loss only "
                               "(and askspec's cispo extension)",
                       tspan, "train with a ppo-loss algorithm (grpo, rloo, ...) or cispo, leave max_staleness out, "
                              "or train with askspec's own trainer")
        elif key in REFUSED:
            sink.error("E604", f"training setting '{key}' cannot be mapped: {REFUSED[key]}", tspan,
                       f"remove '{key}' from the job's spec (a profile can), or train with askspec's own trainer")
        elif key not in SETTINGS:
            sink.error("E604", f"training setting '{key}' has no OpenRLHF 0.11.2 equivalent in askspec's mapping",
                       tspan, f"settings it maps: {', '.join(SETTINGS)}")


def _check_training(exp: ir.Experiment, t: ir.Training, sources: Sources, spec_file: str,
                    substitutes: dict[str, str], sink: DiagnosticSink, games: list[ir.Game] | None = None) -> Phase | None:
    tspan = span_of(t.span, spec_file)
    written = t.written()  # what the block says (a flag is passed only for that)
    algorithm, substituted = t.algorithm, None
    if algorithm in MISSING:
        why, nearest = MISSING[algorithm]
        if algorithm in substitutes:
            algorithm, substituted = substitutes[algorithm], t.algorithm
        else:
            hint = (f"to train with '{nearest}' instead, compile with `--substitute {algorithm}={nearest}` (the job's "
                    f"README records it); or train with askspec's own trainer") if nearest else \
                "train with askspec's own trainer, or export the run's replies for `openrlhf.cli.train_sft`"
            sink.error("E601", f"'{algorithm}' cannot be mapped: {why}", _algorithm_span(t, sources, spec_file), hint)
    elif algorithm in substitutes:
        algorithm, substituted = substitutes[algorithm], t.algorithm
    role = exp.role(t.role)
    model = exp.model(role.model) if role.model else None
    if model is None or model.backend not in TRAINABLE_BACKENDS:
        what = "no fixed model (it is bound per session)" if model is None else f"a {model.backend} model"
        sink.error("E606", f"trained role '{t.role}' has {what}: OpenRLHF trains Hugging Face weights "
                           "(an hf or vllm model)", span_of(role.span, spec_file),
                   f"give '{t.role}' a model declared as hf(\"org/name\") or vllm(\"org/name\")")
    retrain = games is not None  # a retrain stage's one game, over its own data set
    if games is None:
        games = _phase_games(exp, t.role)
    sched = exp.schedule
    outer = not retrain and sched is not None and sched.kind == "nested" and sched.options.get("outer") == t.role
    sizes = set()
    siblings: dict[str, int] = {}
    sample_calls: dict[str, int] = {}
    refused_sample = False  # E603 on a `sample N ask`: its groups of 1 follow from it, and are not reported
    for g in games:
        unreplayable = _replay_problem(exp, g, t.role, games, retrain)
        if unreplayable is not None:
            sink.error("E605", f"game '{g.name}' replays buffer '{replays_buffer(g)}', which another game fills "
                               f"during a run: {unreplayable}", span_of(g.span, spec_file),
                       "replay it in a phase of its own in a `schedule alternating` (driver.sh builds the phase's "
                       "prompts from the buffer as it stands), iterate over a data set or parameter list instead, "
                       "or train with askspec's own trainer")
        resample = _resample_arm(g, t.role, exp.param_values())
        if resample is not None:
            sink.error("E604", f"game '{g.name}' routes a group of '{t.role}' to `resample`: the local trainer plays "
                               "another group in its place (up to 8 refill rounds a step), which OpenRLHF 0.11.2 has "
                               "no equivalent of (its dynamic filtering keeps a prompt by its mean score, not by the "
                               "route's condition)", span_of(resample.span or g.span, spec_file),
                       "route the group to `drop` instead (a smaller step, as the job then trains it), or train "
                       "with askspec's own trainer")
        asks = list(asks_of(g.body, t.role))
        total = sum(m for _, m in asks)
        sampled = any(step.sample is not None for step, _ in asks)
        if sampled:
            shape = _siblings(exp, g, t.role, asks, spec_file, sink, outer)
            refused_sample = refused_sample or shape is None
            if shape is not None:
                per_call, calls = shape
                n = per_call * calls
                siblings[g.name] = n
                if calls > 1:
                    sample_calls[g.name] = calls
                sizes.add(n)
                if written.get("group") not in (None, 1):
                    sink.error("E604", f"`group = {written['group']}` with `sample {n} ask {t.role}` in game "
                                       f"'{g.name}': a local run plays {written['group']} sessions per element, each "
                                       f"with {n} replies of its own, while an OpenRLHF prompt's rollouts are the {n} "
                                       "replies of one session", tspan,
                               f"remove `group`: the {n} replies of the `sample` are the group")
            continue
        if role.memory.kind not in ("full", "shared") and total > 1:  # shared: one conversation a session too
            step = asks[0][0]
            forgets = "each ask starts a new conversation" if role.memory.kind == "none" else \
                "a later ask's prompt drops the exchanges before its window and no longer extends the earlier ones"
            sink.error("E603", f"'{t.role}' (memory = {role.memory.kind}) can be asked {total} times in a session of "
                               f"'{g.name}': {forgets}, so a session holds several trajectories; an OpenRLHF agent "
                               "returns one trajectory per rollout",
                       span_of(step.span, spec_file), f"give '{t.role}' `memory = full` (one conversation per "
                                                      "session), or ask it once per session")
        sizes.add(g.group_size)
    hyper_group = written.get("group")
    group = max(sizes) if sizes and max(sizes) > 1 else int(hyper_group or 1)
    if len({s for s in sizes if s > 1}) > 1:
        sink.error("E604", f"the games that train '{t.role}' sample groups of different sizes ({sorted(sizes)}): "
                           "an OpenRLHF job has one --rollout.n_samples_per_prompt", tspan)
    elif hyper_group is not None and group != int(hyper_group) and not siblings:  # siblings: refused above
        sink.error("E604", f"`group = {hyper_group}` but the game samples {group} sessions per element: OpenRLHF "
                           "groups the samples of one prompt (--rollout.n_samples_per_prompt)", tspan,
                   f"make them agree (e.g. `group = {group}`)")
    if algorithm in ALGORITHMS and openrlhf_algorithm(algorithm, written)[0] in GROUPED_ESTIMATORS \
            and group < 2 and not refused_sample:
        sink.error("E604", f"'{algorithm}' normalises rewards within a group, but '{t.role}' has groups of 1",
                   tspan, "set `group = N` (samples per element) or sample the game (`sample N`)")
    if not games:
        sink.error("E604", f"no game asks '{t.role}': its job would have no rollouts", tspan)
    if algorithm not in ALGORITHMS:
        return None
    return Phase(role=t.role, games=[g.name for g in games], training=t, algorithm=algorithm,
                 substituted=substituted, group=group, steps=written.get("steps"),
                 siblings=siblings, sample_calls=sample_calls)


def _replay_problem(exp: ir.Experiment, g: ir.Game, role: str, games: list[ir.Game], retrain: bool) -> str | None:
    """Why the phase that trains `role` on `games` cannot replay `g`'s buffer, or None
    (g replays none, or it can). A phase's prompt data set is fixed when its job starts, so
    driver.sh draws it from the buffer as it stands then (phase_data.py): the buffer must
    be filled by other phases of an alternating schedule, and its items' order must not
    depend on the replays' scores, which are known only as the phase runs."""
    name = replays_buffer(g)
    if name is None:
        return None
    sched = exp.schedule
    if retrain or sched is None or sched.kind != "alternating":
        return ("an OpenRLHF job's prompt data set is fixed when it starts, and only an alternating schedule's "
                "driver rebuilds it between phases")
    if len(games) > 1:
        return (f"the phase that trains '{role}' also plays {', '.join(x.name for x in games if x is not g)}: a "
                "phase that replays a buffer plays that game alone")
    buf = next(b for b in exp.buffers if b.name == name)
    if buf.eviction in SCORED_EVICTIONS:
        return (f"its eviction `{buf.eviction}` depends on each replay's score, known only as the phase runs, while "
                "the phase's prompts are drawn before it starts (`oldest` and `none` can be drawn ahead)")
    if any(s.kind == "push" and s.buffer == name for s in all_steps(g.body)):
        return "the game pushes to the buffer it replays, and a phase's pushes are visible only once it ends"
    fillers = [t.role for t in exp.training if t.role != role
               and any(s.kind == "push" and s.buffer == name for x in _phase_games(exp, t.role) for s in all_steps(x.body))]
    if not fillers:
        return "no other phase of the schedule pushes to it, so it would be empty"
    return None


def _siblings(exp: ir.Experiment, g: ir.Game, role: str, asks: list, spec_file: str,
              sink: DiagnosticSink, outer: bool = False) -> tuple[int, int] | None:
    """(N, K) when the K x N replies of `sample N ask ROLE` run K times a session can be
    the rollouts of one OpenRLHF prompt: the role's one ask in a session of `g` (not
    beside other asks of it), N known before the run, `g` not sampled itself, and K = 1
    (not in a loop) — or, for the outer role of a nested schedule (`outer`), whose group
    is every dataset of its session, K runs of `repeat` loops with counts known before
    the run. In a multi-policy job (`lockstep`) a `sample N ask` inside a loop is fine: its
    step loop plays the sessions and each run's N replies are a group of their own (an
    OpenRLHF prompt's n_samples_per_prompt), so (N, 1). Otherwise E603 says why."""
    step, mult = next((s, m) for s, m in asks if s.sample is not None)
    where = span_of(step.span, spec_file)
    calls = 1
    own_session = (f"or make each sample a session of its own: `game {g.name} ... sample N` with one `ask {role}` "
                   "(its route sees the group)")
    if len(asks) > 1:
        sink.error("E603", f"'{role}' is asked {len(asks)} times in a session of '{g.name}', one of them `sample N "
                           f"ask {role}`: an OpenRLHF prompt's rollouts are the N replies of one ask, and the role's "
                           "other turns would belong to none of them", where,
                   f"ask '{role}' only in the `sample` step, {own_session}")
        return None
    if mult > 1 and outer:
        runs = _repeat_runs(g.body, step, exp.param_values())
        if runs is None:
            sink.error("E603", f"`sample N ask {role}` of the nested schedule's outer role sits in a session of "
                               f"'{g.name}' inside a loop other than `repeat` with bounds known before the run, or "
                               "inside a branch: its datasets, all of them the rollouts of one OpenRLHF prompt, must "
                               "number the same in every session (--rollout.n_samples_per_prompt is fixed when the job "
                               "starts)", where,
                       "sample inside `repeat k in 1..K` loops whose bounds are literals or parameters (one "
                       "dataset per run), not inside `for`, `while` or `if`")
            return None
        calls = runs
    elif mult > 1 and not lockstep(exp):
        sink.error("E603", f"`sample N ask {role}` can run {mult} times in a session of '{g.name}' (it is inside a "
                           "loop): each run samples a group of its own, while an OpenRLHF prompt's rollouts form one",
                   where, f"sample once per session (outside the loop), {own_session}")
        return None
    try:
        n = const_value(step.sample, exp.param_values())
    except Unknown:
        n = None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        sink.error("E603", f"the number of replies of `sample N ask {role}` is not known before the run: OpenRLHF's "
                           "rollouts per prompt (--rollout.n_samples_per_prompt) are fixed when the job starts",
                   where, "sample a literal or a parameter")
        return None
    if g.group_size > 1:
        sink.error("E603", f"game '{g.name}' samples {g.group_size} sessions per element and each asks `sample {n} "
                           f"ask {role}`: {g.group_size} groups of {n} replies for one prompt, while an OpenRLHF "
                           "prompt's rollouts form one group", where,
                   f"remove the game's `sample {g.group_size}` (the {n} replies are the group), or ask '{role}' "
                   "once per session")
        return None
    return n, calls


def _repeat_runs(steps: list, target: ir.Step, params: dict) -> int | None:
    """How many times `target` runs per run of `steps` when every loop around it is a
    `repeat` with bounds known before the run (its count: the runs); None when it sits
    inside another loop or a branch, or is not found."""
    for s in steps:
        if s is target:
            return 1
        inside = [(times, body) for times, body in bodies(s) if any(x is target for x in all_steps(body))]
        if not inside:
            continue
        if not isinstance(s, ir.RepeatStep):
            return None
        try:
            start, stop = const_value(s.start, params), const_value(s.stop, params)
        except Unknown:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop)):
            return None
        runs = _repeat_runs(inside[0][1], target, params)
        return None if runs is None else max(0, stop - start + 1) * runs
    return None


def _check_nested(exp: ir.Experiment, sched: ir.Schedule, spec_file: str, sink: DiagnosticSink) -> None:
    """E602 for a nested schedule the job cannot run as the local schedule does. The job
    trains the outer role; an outer step is one session, one prompt whose rollouts are
    its `sample N ask OUTER` replies, K calls x N (the datasets: the outer role's group,
    as in a local run); a grounded R_k comes from the job's inner-loop service, which
    trains the inner role's copies with askspec's own trainer (inner_loop.py)."""
    where = span_of(sched.span, spec_file)
    outer, inner = str(sched.options.get("outer")), str(sched.options.get("inner"))
    grounded = str(sched.options.get("outer_reward") or "grounded") == "grounded"
    t = next((t for t in exp.training if t.role == outer), None)
    params = exp.param_values()
    for g in _phase_games(exp, outer):
        plain = [s for s, _ in asks_of(g.body, outer) if s.sample is None]
        if plain:
            sink.error("E602", f"game '{g.name}' asks '{outer}', the nested schedule's outer role, without `sample N`: "
                               f"its group is the replies of one session (an outer step's datasets), and a session "
                               f"of '{g.name}' holds one reply per ask", span_of(plain[0].span, spec_file),
                       f"sample each dataset of an outer step: `repeat k in 1..K {{ xs = sample N ask {outer} }}`, "
                       "or use askspec's own trainer")
        live = _live_asks(g.body, params) if grounded else []
        served = [(s, r) for s in live for r in s.roles if r == inner or _plays_weights_of(exp, r, inner)]
        if served:
            step, who = served[0]
            sink.error("E602", f"game '{g.name}' asks '{who}' on the weights of '{inner}', the nested schedule's inner "
                               "role: the job's inner-loop service changes them at each promotion, while the job "
                               "serves them frozen with their initial weights", span_of(step.span, spec_file),
                       f"ask '{inner}' only in the schedule's practice and evaluate games (the service plays them), "
                       "or use askspec's own trainer")
    if t is not None and "batch" in t.given:
        sink.error("E602", f"`batch = {lowered(t).batch}` for '{outer}', the nested schedule's outer role: the job runs "
                           "one outer step per session (one prompt, its datasets' replies the rollouts), and the "
                           "inner loop is decided per outer step", span_of(t.span, spec_file),
                   "remove `batch` (one session per outer step, as the local schedule plays it)")


def _plays_weights_of(exp: ir.Experiment, role: str, trained: str) -> bool:
    r = exp.role(role)
    model = exp.model(r.model) if r is not None and r.model else None
    return model is not None and model.weights_of == trained


def _live_asks(steps: list, params: dict) -> list:
    """The ask steps of `steps` that can run, leaving out branches whose condition the
    parameters decide (SOAR's `if teacher_reward == "intrinsic"` under the grounded profile)."""
    out: list = []
    for s in steps:
        if s.kind == "ask":
            out.append(s)
        if isinstance(s, ir.IfStep):
            for b in s.branches:
                decided = _const_truth(b.cond, params)
                if decided is not False:
                    out += _live_asks(b.body, params)
                if decided is True:
                    break
            else:
                out += _live_asks(s.orelse, params)
            continue
        for _, body in bodies(s):
            out += _live_asks(body, params)
    return out


def _resample_arm(g: ir.Game, role: str, params: dict) -> ir.RouteArm | None:
    """The first `resample` arm of a route of `role` in `g` that a group can reach, leaving
    out arms the parameters rule out (Reasoning Arena's `when routing == "rlvr"` under
    another routing) or that an arm the parameters always take comes before."""
    for rt in g.routes:
        if rt.role not in (role, "*"):
            continue
        for arm in rt.arms:
            decided = True if arm.cond is None else _const_truth(arm.cond, params)
            if decided is False:
                continue
            if arm.action == "resample":
                return arm
            if decided is True:
                break
    return None


def _const_truth(e: ir.Expr, params: dict) -> bool | None:
    """A condition's value when the parameters decide it (== and != of constants), else None."""
    if isinstance(e, ir.BinaryOp) and e.op in ("==", "!="):
        try:
            a, b = const_value(e.left, params), const_value(e.right, params)
        except Unknown:
            return None
        return (a == b) if e.op == "==" else (a != b)
    return None


def _phase_games(exp: ir.Experiment, role: str) -> list[ir.Game]:
    """The games a role's job plays: the schedule's `games` for it, else every game that asks it."""
    chosen = None
    games = exp.schedule.options.get("games") if exp.schedule is not None else None
    if isinstance(games, dict):  # alternating: {role: game or list}
        chosen = games.get(role)
    elif games:  # online: the games every iteration plays
        chosen = games
    if isinstance(chosen, str):
        chosen = [chosen]
    if chosen:
        return [g for g in exp.games if g.name in chosen]
    held = held_out_games(exp)  # what evaluate stages play and retrain stages sample with: never trained on
    return [g for g in exp.games if g.name not in held and any(True for _ in asks_of(g.body, role))]
