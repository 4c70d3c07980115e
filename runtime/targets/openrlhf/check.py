"""Which parts of a compiled spec an OpenRLHF 0.11.2 job can express, as a plan of
phase jobs, and diagnostics (E601-E607, W601, with spans) for everything it cannot.

Every refusal says what cannot be mapped, why, and the alternative; the checks run to
the end so one compile lists every problem (docs/cluster.md lists them per spec)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from askspec.ir import model as ir
from askspec.lang.diagnostics import DiagnosticSink, Sources
from askspec.lang.exprs import suggest
from askspec.lang.span import Span

from askspec.runtime.engine.plan import replays_buffer
from askspec.runtime.targets.openrlhf.mapping import (ALGORITHMS, GROUPED_ESTIMATORS, LOSS_AGGREGATION, MISSING,
                                                      SETTINGS)

TRAINABLE_BACKENDS = ("hf", "vllm")


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


@dataclass
class JobPlan:
    phases: list[Phase]
    iterations: int = 1  # cycles of the phase sequence (alternating schedules)
    notes: list[str] = field(default_factory=list)


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
        k = s.kind
        if k == "ask" and role in s.roles:
            yield s, mult
        elif k == "repeat":
            yield from asks_of(s.body, role, mult * s.bound)
        elif k == "while":
            yield from asks_of(s.body, role, mult * s.limit)
        elif k == "for":
            yield from asks_of(s.body, role, mult * s.limit)
        elif k == "if":
            for b in s.branches:
                yield from asks_of(b.body, role, mult)
            yield from asks_of(s.orelse, role, mult)


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
    if sched is not None and sched.kind == "nested":
        sink.error("E602", "a `nested` schedule (an inner loop of trained copies inside each outer step) cannot be "
                           "expressed as OpenRLHF jobs: one job trains one policy, and jobs cannot run inside a rollout",
                   span_of(sched.span, spec_file), "train the roles one after the other with `schedule alternating`, "
                                                   "or use askspec's own trainer")
    elif len(trainings) > 1 and (sched is None or sched.kind == "online"):
        where = sched.span if sched is not None else exp.training[1].span
        sink.error("E602", f"online training of {len(trainings)} roles ({', '.join(trainings)}) in one job: OpenRLHF "
                           "trains one policy per job", span_of(where, spec_file),
                   "declare `schedule alternating { ROLE = STEPS ... }`: each phase becomes a job that starts from "
                   "the previous phase's checkpoints")

    for stage in exp.stages:
        if stage.kind != "train":  # the job is the RL schedule: say what it leaves out, not silently
            sink.warn("W601", f"stage '{stage.name}' ({stage.kind}) is not part of the OpenRLHF job, which runs "
                              "the RL schedule (the `train` stage) only", span_of(stage.span, spec_file),
                      "run it with askspec's own trainer (`askspec run`), before the job (sft) or against its "
                      "checkpoint (evaluate)")

    phases: list[Phase] = []
    for t in exp.training:
        phase = _check_training(exp, t, sources, spec_file, substitutes, sink)
        if phase is not None:
            phases.append(phase)
    if sink.has_errors:
        return None
    plan = JobPlan(phases=phases)
    if sched is not None and sched.kind == "online" and "steps" in sched.options and len(phases) == 1:
        phases[0].steps = int(sched.options["steps"])
    if sched is not None and sched.kind == "alternating":
        order = [k for k in sched.options if k in trainings]
        plan.phases = sorted(phases, key=lambda p: order.index(p.role) if p.role in order else len(order))
        for p in plan.phases:
            if p.role in sched.options:
                p.steps = int(sched.options[p.role])
        plan.iterations = int(sched.options.get("iterations", 1))
    return plan


def _check_training(exp: ir.Experiment, t: ir.Training, sources: Sources, spec_file: str,
                    substitutes: dict[str, str], sink: DiagnosticSink) -> Phase | None:
    tspan = span_of(t.span, spec_file)
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
    for key in t.hyper:
        if key == "replay":
            sink.error("E605", f"`replay = {t.hyper[key]}`: a buffer lives in one run, and an OpenRLHF job's prompt "
                               "data set is fixed when it starts", tspan,
                       "train on the games' own elements, or with askspec's own trainer")
        elif key == "aggregation" and t.hyper[key] not in LOSS_AGGREGATION:
            sink.error("E604", f"`aggregation = {t.hyper[key]}` has no OpenRLHF 0.11.2 equivalent (its loss "
                               f"aggregations: {', '.join(LOSS_AGGREGATION)})", tspan,
                       "aggregate by token or sequence, or train with askspec's own trainer")
        elif key not in SETTINGS:
            sink.error("E604", f"training setting '{key}' has no OpenRLHF 0.11.2 equivalent in askspec's mapping",
                       tspan, suggest(key, SETTINGS) or f"settings: {', '.join(SETTINGS)}")
    games = _phase_games(exp, t.role)
    sizes = set()
    for g in games:
        if replays_buffer(g) is not None:
            sink.error("E605", f"game '{g.name}' replays buffer '{replays_buffer(g)}', which another game fills "
                               "during a run: an OpenRLHF job's prompt data set is fixed when it starts",
                       span_of(g.span, spec_file), "iterate over a data set or parameter list instead, or train "
                                                  "with askspec's own trainer")
        asks = list(asks_of(g.body, t.role))
        total = sum(m for _, m in asks)
        sampled = False
        for step, _ in asks:
            if step.sample is not None:
                sampled = True
                sink.error("E603", f"`sample N ask {t.role}` gives the trained role N trajectories in one session; an "
                                   "OpenRLHF agent returns one trajectory per rollout", span_of(step.span, spec_file),
                           f"make each sample a session of its own: `game {g.name} ... sample N` with one "
                           f"`ask {t.role}` (its route sees the group)")
        if role.memory.kind != "full" and total > 1 and not sampled:
            step = asks[0][0]
            sink.error("E603", f"'{t.role}' (memory = {role.memory.kind}) can be asked {total} times in a session of "
                               f"'{g.name}': each ask starts a new conversation, so a session holds several "
                               "trajectories; an OpenRLHF agent returns one trajectory per rollout",
                       span_of(step.span, spec_file), f"give '{t.role}' `memory = full` (one conversation per "
                                                      "session), or ask it once per session")
        sizes.add(g.group_size)
    hyper_group = t.hyper.get("group")
    group = max(sizes) if sizes and max(sizes) > 1 else int(hyper_group or 1)
    if len({s for s in sizes if s > 1}) > 1:
        sink.error("E604", f"the games that train '{t.role}' sample groups of different sizes ({sorted(sizes)}): "
                           "an OpenRLHF job has one --rollout.n_samples_per_prompt", tspan)
    elif hyper_group is not None and group != int(hyper_group):
        sink.error("E604", f"`group = {hyper_group}` but the game samples {group} sessions per element: OpenRLHF "
                           "groups the samples of one prompt (--rollout.n_samples_per_prompt)", tspan,
                   f"make them agree (e.g. `group = {group}`)")
    if algorithm in ALGORITHMS and ALGORITHMS[algorithm][0] in GROUPED_ESTIMATORS and group < 2:
        sink.error("E604", f"'{algorithm}' normalises rewards within a group, but '{t.role}' has groups of 1",
                   tspan, "set `group = N` (samples per element) or sample the game (`sample N`)")
    if not games:
        sink.error("E604", f"no game asks '{t.role}': its job would have no rollouts", tspan)
    if algorithm not in ALGORITHMS:
        return None
    return Phase(role=t.role, games=[g.name for g in games], training=t, algorithm=algorithm,
                 substituted=substituted, group=group, steps=int(t.hyper["steps"]) if "steps" in t.hyper else None)


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
    return [g for g in exp.games if any(True for _ in asks_of(g.body, role))]
