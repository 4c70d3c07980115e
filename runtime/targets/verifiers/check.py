"""Which parts of a compiled spec a verifiers 0.4.0 environment can express, and
diagnostics (E702-E709, with spans) for everything it cannot.

A verifiers environment plays one task as one episode, alone, and its run trains one
policy (the run's model). So: at most one trained role; no schedule that trains roles in
turn or nests training; no stages; no game that waits for a buffer other sessions fill;
no route that scores a group of sessions together; no reward that depends on earlier
sessions (diversity(), novelty()); no role whose name the environment's config cannot
take as a field, or that plays no served model (`python`, `replay`). The checks run to the end so one
compile lists every problem."""

from __future__ import annotations

import keyword
import re

from askspec.diagnostics import DiagnosticSink, Sources
from askspec.ir import model as ir
from askspec.ir.plansize import replays_buffer
from askspec.ir.walk import all_steps
from askspec.span import Span

from askspec.runtime.engine.stateful import calls_stateful
from askspec.runtime.targets.openrlhf.check import span_of

# verifiers' EnvConfig fields: a role becomes a field of the generated config, so it cannot take one of these
ENV_FIELDS = frozenset({"id", "taskset", "timeout", "retries", "max_concurrent_agents", "interception"})


def trained_roles(exp: ir.Experiment) -> list[str]:
    """The roles the spec trains: its `train` blocks' (else the roles marked `trained`)."""
    roles = list(dict.fromkeys(t.role for t in exp.training))
    return roles or [r.name for r in exp.roles if r.trained]


def check(exp: ir.Experiment, sources: Sources, spec_file: str, sink: DiagnosticSink) -> str | None:
    """The trained role (None: the spec trains none); refusals go to `sink`."""
    fallback = span_of(None, spec_file)
    trained = trained_roles(exp)
    if len(trained) > 1:
        second = next((t for t in exp.training if t.role == trained[1]), None)
        where = second.span if second is not None else exp.role(trained[1]).span
        d = sink.error("E702", f"{len(trained)} trained roles ({', '.join(trained)}): a verifiers environment trains "
                               "one policy, the run's model", span_of(where, spec_file),
                       "train one role and keep the others frozen (one environment per trained role), or "
                       "train with askspec's own trainer")
        first = next((t for t in exp.training if t.role == trained[0]), None)
        if first is not None:
            d.notes.append((f"'{trained[0]}' is trained here", span_of(first.span, spec_file)))
    sched = exp.schedule
    if sched is not None and sched.kind == "nested":
        sink.error("E703", "`schedule nested` trains an inner role inside every outer step: a verifiers environment "
                           "scores each episode alone, with one policy", span_of(sched.span, spec_file),
                   "compile the inner game on its own, or use askspec's own trainer")
    for st in exp.stages:
        if st.kind == "train":  # the RL schedule's own place: what the environment plays
            continue
        sink.error("E704", f"stage '{st.name}' ({st.kind}): a verifiers environment is one game, with no stages",
                   span_of(st.span, spec_file),
                   "compile a spec without `stages` (the RL schedule's games), and run the other stages with "
                   "`askspec run --stage`")
    for g in exp.games:
        buffer = replays_buffer(g)
        if buffer is not None:
            sink.error("E705", f"game '{g.name}' replays buffer '{buffer}', which other sessions fill during a run: "
                               "a verifiers task is one session, planned before the run",
                       span_of(g.span, spec_file), "iterate over a data set or parameter list instead")
        for route in g.routes:
            sink.error("E706", f"game '{g.name}' routes its groups (`route {route.role}`): a verifiers episode is "
                               "one session, scored alone, and no route sees its group",
                       span_of(route.span or g.span, spec_file),
                       "score each session with `reward` (verifiers groups episodes with --num-rollouts), or run "
                       "the routes with `askspec run`")
        stateful = next((s for s in all_steps(g.body) if calls_stateful(s)), None)
        if stateful is not None:
            sink.error("E708", f"game '{g.name}' calls diversity() or novelty(), whose value depends on the texts "
                               "earlier sessions sent: a verifiers episode is scored alone",
                       span_of(stateful.span or g.span, spec_file),
                       "reward from the session's own replies, or run the game with `askspec run`")
    for r in exp.roles:
        if r.name in ENV_FIELDS or r.name.startswith("_") or keyword.iskeyword(r.name):
            sink.error("E707", f"role '{r.name}' becomes a field of the environment's config, and verifiers' "
                               f"EnvConfig has its own '{r.name}'" if r.name in ENV_FIELDS else
                       f"role '{r.name}' cannot be a field of the environment's config",
                       _name_span(r, sources, spec_file), "rename the role")
        model = exp.model(r.model) if r.model else None
        if model is not None and model.backend in ("python", "replay"):
            sink.error("E709", f"role '{r.name}' plays a `{model.backend}` model: in a verifiers environment every "
                               "role is an agent whose calls go to a served model",
                       _name_span(r, sources, spec_file),
                       "give the role an `openai` or `hf` model (verifiers serves it by its name), or score its "
                       "part with `reward` expressions")
    if not exp.roles:
        sink.error("E707", f"experiment '{exp.name}' has no roles: a verifiers environment needs an agent", fallback)
    return trained[0] if trained else None


def _name_span(r: ir.Role, sources: Sources, fallback: str) -> Span:
    """The name inside `role NAME { ... }` (the IR keeps the whole declaration's span)."""
    whole = span_of(r.span, fallback)
    m = re.compile(r"\brole\s+(" + re.escape(r.name) + r")\b").search(sources.line(whole.file, whole.line) or "",
                                                                         whole.col - 1)
    return Span(whole.file, whole.line, m.start(1) + 1, whole.line, m.end(1) + 1) if m else whole
