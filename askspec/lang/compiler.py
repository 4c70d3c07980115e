"""The compile pipeline: read -> parse -> collect declarations -> check and lower each
declaration -> check games -> warnings for unused declarations -> IR.

`compile_file` never raises for user input: every problem becomes a Diagnostic."""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from ..ir import model as ir
from . import ast as A
from . import profiles
from .blocks import BlockChecks
from .checker_base import CheckContext
from .roles import RoleChecks, lower_sampling
from .stages import StageChecks
from .training import TrainingChecks, lower_training
from .consts import INVALID, NotConstant, OutOfRange, TooLarge, const_eval, parse_override
from ..diagnostics import Diagnostic, DiagnosticSink, Sources
from .exprs import irspan, suggest, suggestion_budget
from .games import GameChecker
from .parser import decode_source, parse, read_source
from .phases import lower_phases
from .plan_check import check_plan_size, check_training_size
from ..span import Span
from .types import ANY, OPEN_RECORD, T, TYPE_NAMES, from_json_value, is_a, list_of

EXPERIMENT_KEYS = {"seed", "description", "profile"}


def meant_game(name: str, games: list[A.GameDecl]) -> str:
    """The declared game `name` is, or the one it most likely misspells (as suggest() finds)."""
    declared = [g.name for g in games]
    close = [] if name in declared else difflib.get_close_matches(name, declared, n=1, cutoff=0.7)
    return close[0] if close else name


@dataclass


class CompileResult:
    ir: ir.Experiment | None
    sink: DiagnosticSink
    sources: Sources
    files: dict[str, str] = field(default_factory=dict)  # spec + prompt files as read (relative paths)

    @property
    def ok(self) -> bool:
        return self.ir is not None and not self.sink.has_errors


def compile_file(path: str, overrides: dict[str, str] | None = None, profile: str | None = None,
                 all_profiles: bool = False, data: dict[str, str] | None = None) -> CompileResult:
    """Compile the spec at ``path`` in one configuration (``profile``, else the spec's
    default). ``all_profiles`` (`askspec check` without --profile) also checks every other
    profile and adds the errors only they have, each with a note naming its profile.
    ``data`` maps data blocks to a user's files (`--data NAME=FILE`, data_override.py)."""
    sink, sources = DiagnosticSink(), Sources()
    try:
        source = read_source(path)
    except OSError as e:
        sink.error("E004", f"cannot read {path}: {e.strerror or e}", None)
        return CompileResult(None, sink, sources)
    return compile_bytes(path, source, overrides, sink, sources, profile, all_profiles, data)


def compile_source(path: str, text: str, overrides: dict[str, str] | None = None,
                   profile: str | None = None, all_profiles: bool = False,
                   data: dict[str, str] | None = None) -> CompileResult:
    return compile_bytes(path, text.encode("utf-8", "surrogatepass"), overrides, profile=profile,
                         all_profiles=all_profiles, data_files=data)


def compile_bytes(path: str, data: bytes, overrides: dict[str, str] | None = None,
                  sink: DiagnosticSink | None = None, sources: Sources | None = None,
                  profile: str | None = None, all_profiles: bool = False,
                  data_files: dict[str, str] | None = None) -> CompileResult:
    sink, sources = sink or DiagnosticSink(), sources or Sources()
    try:
        text = decode_source(path, data, sink)
        if text is None:
            sources.add(path, data.decode("utf-8", "replace"))  # to show the offending line
            return CompileResult(None, sink, sources)
        sources.add(path, text)
        module = parse(path, text, sink)
        if module is None:
            return CompileResult(None, sink, sources)
        files = {os.path.basename(path): text}
        with suggestion_budget():
            exp = Compiler(path, sink, sources, files, overrides or {}, profile, data_files).run(module)
            if all_profiles and profile is None:
                _check_other_profiles(path, module, exp.options.get("profile"), overrides or {}, sink, sources,
                                      data_files)
        return CompileResult(None if sink.has_errors else exp, sink, sources, files)
    except RecursionError:
        sink.error("E005", "spec nested too deeply to compile", Span(path, 1, 1, 1, 2))
    except Exception as e:  # the last line of defence: never show a traceback
        if os.environ.get("ASKSPEC_DEBUG"):
            raise
        sink.error("E999", f"internal compiler error: {e.__class__.__name__}: {e}", Span(path, 1, 1, 1, 2))
    return CompileResult(None, sink, sources)


def _check_other_profiles(path: str, module: A.Module, selected: str | None, overrides: dict[str, str],
                          sink: DiagnosticSink, sources: Sources, data_files: dict[str, str] | None = None) -> None:
    """Check each profile other than ``selected`` as `--profile NAME` would, and add to
    ``sink`` the errors the selected configuration does not have: an error in every
    configuration is reported once, one only some profiles have once with a note per
    profile. Their warnings are left out (each configuration's own `check --profile`).
    The AST is shared: a compile reads it and never changes it (profiles.select applies
    a profile to copies)."""
    seen = {(d.code, d.message, d.span) for d in sink.items}
    added: dict[tuple, Diagnostic] = {}
    checked: set[str] = set()
    for p in [d for d in module.decls if isinstance(d, A.ProfileDecl)]:
        if p.name == selected or p.name in checked:
            continue  # the configuration already checked; a profile declared twice is E104
        checked.add(p.name)
        other = DiagnosticSink()
        Compiler(path, other, sources, {}, overrides, p.name, data_files).run(module)
        for d in other.items:
            key = (d.code, d.message, d.span)
            if not d.is_error or key in seen:
                continue
            if key not in added:
                added[key] = sink.error(d.code, d.message, d.span, d.hint)
                added[key].notes.extend(d.notes)
            added[key].notes.append((f"in profile {p.name}", p.name_span))


def parse_type(t: A.TypeExpr | None, sink: DiagnosticSink) -> T | None:
    if t is None:
        return None
    if t.name == "list":
        if len(t.args) != 1:
            sink.error("E107", "list takes one element type: list[T]", t.span)
            return list_of(ANY)
        return list_of(parse_type(t.args[0], sink) or ANY)
    if t.name == "record":
        return OPEN_RECORD
    if t.args:
        sink.error("E107", f"type '{t.name}' takes no arguments", t.span)
    found = TYPE_NAMES.get(t.name)
    if found is None:
        sink.error("E107", f"unknown type '{t.name}'", t.span, suggest(t.name, TYPE_NAMES) or "types: number, bool, string, list[T], record, any")
        return ANY
    return found


class Compiler:
    """Checks one module and builds its IR: the profile's declarations, then each pass of
    PASSES in order over one check context (checker_base.py). A pass is a function of the
    context and the declarations; the declaration kinds' own checks are objects on the
    context (roles.py, training.py, blocks.py, stages.py; games.py per game)."""

    def __init__(self, path: str, sink: DiagnosticSink, sources: Sources, files: dict[str, str],
                 overrides: dict[str, str], profile: str | None = None, data_files: dict[str, str] | None = None) -> None:
        self.ctx = ctx = CheckContext(path, sink, sources, files, overrides, profile, data_files)
        ctx.role_checks, ctx.training_checks = RoleChecks(ctx), TrainingChecks(ctx)
        ctx.block_checks, ctx.stage_checks = BlockChecks(ctx), StageChecks(ctx)

    def run(self, module: A.Module) -> ir.Experiment:
        ctx = self.ctx
        selection = profiles.select(module.decls, ctx.profile, ctx.sink)
        # a parameter another configuration uses is not unused: one a profile mentions
        # (PasoDoble's online_steps in the offline profile) or one the schedule that the
        # selected profile replaced mentions (its T_P, T_S in the online profile)
        ctx.profile_names = {n for d in module.decls if isinstance(d, A.ProfileDecl) or (
            isinstance(d, A.BlockDecl) and d.kind == "schedule" and d not in selection.decls) for n in A.names_in(d)}
        if selection.profile is not None:
            ctx.exp.options["profile"] = selection.profile  # the IR is this configuration's
        for check in PASSES:
            check(ctx, selection.decls)
        ctx.exp.templates = dict(sorted(ctx.templates.items()))
        return ctx.exp


# ---- the passes, in the order they run: each checks what it owns and fills the IR; a later
# pass reads what the earlier ones declared (names, parameters, templates, roles, games)


def _experiment_block(ctx: CheckContext, decls: list) -> None:
    experiments = [d for d in decls if isinstance(d, A.Experiment)]
    if len(experiments) > 1:
        ctx.err("E104", "only one experiment block per file", experiments[1].span)
    if experiments:
        ctx.exp.name = experiments[0].name
        for a in experiments[0].attrs:
            if a.name == "profile":
                continue  # the default profile: read by profiles.select
            if a.name not in EXPERIMENT_KEYS:
                ctx.err("E105", f"unknown experiment setting '{a.name}'", a.name_span,
                        suggest(a.name, EXPERIMENT_KEYS) or "settings: seed, description, profile (use 'param' for the rest)")
            ctx.exp.options[a.name] = ctx.const(a.value, f"experiment setting '{a.name}'")


def _params(ctx: CheckContext, decls: list) -> None:
    params = [p for e in decls if isinstance(e, A.Experiment) for p in e.params] + [d for d in decls if isinstance(d, A.Param)]
    for p in params:
        _param(ctx, p)
    for key in ctx.overrides:
        if key not in ctx.params:
            ctx.err("E111", f"--set {key}: no parameter named '{key}'", None,
                    suggest(key, ctx.params) or (f"parameters: {', '.join(sorted(ctx.params))}" if ctx.params
                                                 else "this spec declares no parameters"))


def _templates(ctx: CheckContext, decls: list) -> None:
    for d in decls:
        if isinstance(d, A.TemplateDecl) and ctx.declare("template", d.name, d.name_span):
            if ctx.template(d.value, f"named:{d.name}") == INVALID:
                ctx.broken_templates.add(d.name)


def _declarations(ctx: CheckContext, decls: list) -> None:
    """Every model, role, data set and block name, before any is checked (they refer to
    each other in any order)."""
    for d in decls:
        if isinstance(d, A.ModelDecl):
            ctx.declare("model", d.name, d.name_span)
    for d in decls:
        if isinstance(d, A.RoleDecl):
            for name, span in d.names:
                if ctx.declare("role", name, span):
                    ctx.role_decls[name] = d
        elif isinstance(d, (A.DataDecl,)):
            ctx.declare("data", d.name, d.name_span)
        elif isinstance(d, A.BlockDecl) and d.kind != "schedule":
            ctx.declare(d.kind, d.name, d.name_span)
    declared_data = [d.name for d in decls if isinstance(d, A.DataDecl)]
    for key in ctx.data_files:
        if key not in declared_data:
            ctx.err("E111", f"--data {key}: no data block named '{key}'", None,
                    suggest(key, declared_data) or (f"data blocks: {', '.join(declared_data)}" if declared_data
                                                    else "this spec declares no data block"))


def _models_and_roles(ctx: CheckContext, decls: list) -> None:
    ctx.role_checks.models([d for d in decls if isinstance(d, A.ModelDecl)])
    for d in decls:
        if isinstance(d, A.RoleDecl):
            ctx.role_checks.role(d)
    ctx.role_checks.check_conversations()
    lower_sampling(ctx.exp)


def _data_and_blocks(ctx: CheckContext, decls: list) -> None:
    blocks = ctx.block_checks
    for d in decls:
        if isinstance(d, A.DataDecl):
            blocks.data(d)
        elif isinstance(d, A.BlockDecl) and d.kind != "schedule":
            blocks.BLOCKS[d.kind](blocks, d)


def _games(ctx: CheckContext, decls: list) -> None:
    ctx.schedule_rewarded = _nested_rewarded(ctx, decls)
    games = [d for d in decls if isinstance(d, A.GameDecl)]
    # games a retrain stage samples its items with: their replies are data, never trained on (no E402);
    # a misspelt or bracketed `sample` is the stage's error alone, not also E402 on the game it meant
    for d in decls:
        for a in d.attrs if isinstance(d, A.StageDecl) else []:
            if a.name == "sample":
                names = a.value.items if isinstance(a.value, A.ListLit) else [a.value]
                ctx.sample_games |= {meant_game(x.id if isinstance(x, A.Name) else x.value, games)
                                     for x in names if isinstance(x, (A.Name, A.String))}
    if not games:
        # an empty file (or one holding only declarations) would run nothing at all
        ctx.err("E114", "nothing to run: the spec declares no game", Span(ctx.path, 1, 1, 1, 2),
                "a game plays the sessions: game NAME { ask ROLE }; see docs/language.md#game")
    for g in games:
        if ctx.declare("game", g.name, g.name_span):
            ctx.exp.games.append(GameChecker(ctx, g).run())
    check_plan_size(ctx.exp, {g.name: g.name_span for g in games}, ctx.sink)


def _train_blocks(ctx: CheckContext, decls: list) -> None:
    for d in decls:
        if isinstance(d, A.TrainDecl):
            ctx.block_checks.train(d)
    _check_buffer_scores(ctx)


def _schedule(ctx: CheckContext, decls: list) -> None:
    schedules = [d for d in decls if isinstance(d, A.BlockDecl) and d.kind == "schedule"]
    if len(schedules) > 1:
        ctx.err("E104", "only one schedule per experiment", schedules[1].span)
    if schedules:
        ctx.block_checks.block_schedule(schedules[0])


def _stages(ctx: CheckContext, decls: list) -> None:
    ctx.stage_checks.stages([d for d in decls if isinstance(d, A.StageDecl)])


def _lowered_training(ctx: CheckContext, decls: list) -> None:
    """The train blocks lowered (the schedule and stages are known), their size, and the
    schedule's phases (a spec with errors has no IR to lower them into)."""
    lower_training(ctx.exp, ctx.written_training)
    if not ctx.sink.has_errors:
        lower_phases(ctx.exp)
    check_training_size(ctx.exp, {d.role: {"": d.span, **{a.name: a.value.span for a in d.attrs}}
                                  for d in decls if isinstance(d, A.TrainDecl)}, ctx.sink)


def _metrics(ctx: CheckContext, decls: list) -> None:
    for m in [d for d in decls if isinstance(d, A.MetricDecl)]:
        if ctx.declare("metric", m.name, m.name_span):
            ctx.block_checks.metric(m)


def _warnings(ctx: CheckContext, decls: list) -> None:
    _check_contests_roles(ctx)
    ctx.role_checks.warn_quantized_trained()
    _warn_unused(ctx)


PASSES: tuple[Callable[[CheckContext, list], None], ...] = (
    _experiment_block, _params, _templates, _declarations, _models_and_roles, _data_and_blocks, _games,
    _train_blocks, _schedule, _stages, _lowered_training, _metrics, _warnings)


def _nested_rewarded(ctx: CheckContext, decls: list) -> set[str]:
    """The role whose reward the schedule supplies: a nested schedule's outer role with
    the grounded outer reward (the inner loop's accuracy gain), exempt from E402."""
    for d in decls:
        if isinstance(d, A.BlockDecl) and d.kind == "schedule" and d.name == "nested":
            attrs = {a.name: a.value for a in d.attrs}
            how = attrs.get("outer_reward")
            value = "grounded" if how is None else (
                how.id if isinstance(how, A.Name) and how.id not in ctx.params else ctx.params.get(getattr(how, "id", ""), ""))
            outer = attrs.get("outer")
            if value == "grounded" and isinstance(outer, A.Name):
                return {outer.id}
    return set()


def _param(ctx: CheckContext, p: A.Param) -> None:
    if not ctx.declare("param", p.name, p.name_span):
        return
    declared = parse_type(p.type, ctx.sink)
    type_text = str(p.type) if p.type is not None and declared is not None else None
    value = ctx.const(p.default, f"the default of parameter '{p.name}'")
    if value is not None and declared is not None and type_text is not None:
        problem = _type_problem(value, declared, type_text)
        if problem:
            ctx.err("E201", f"parameter '{p.name}' is {type_text} but its default is {problem}", p.default.span)
            value = _zero(declared)  # a well-typed stand-in, so uses do not report again
            ctx.broken_params.add(p.name)  # and no setting built from it is judged by that stand-in
    if p.name in ctx.overrides:
        value = _override(ctx, p, declared, type_text, value)
    t = declared or (from_json_value(value) if value is not None else ANY)
    ctx.params[p.name] = value
    ctx.param_types[p.name] = t
    ctx.param_spans[p.name] = p.name_span
    ctx.exp.params.append(ir.Param(span=irspan(p.span), name=p.name, type=type_text or str(t), value=value))


def _override(ctx: CheckContext, p: A.Param, declared: T | None, type_text: str | None, value: Any) -> Any:
    """The value of `--set NAME=RAW` for parameter `p`, or its default when it does not fit."""
    raw = ctx.overrides[p.name]
    try:
        expr = parse_override(raw)
        new = const_eval(expr, ctx.params) if expr is not None else raw
    except (OutOfRange, TooLarge) as nc:
        ctx.err("E111", f"--set {p.name}={_shorten(raw)}: {nc.why}", p.name_span)
        return value
    except NotConstant:
        new = raw  # a bare word is a string: --set routing=pointwise
    want = declared or (from_json_value(value) if value is not None else None)
    problem = _type_problem(new, want, type_text or str(want)) if want is not None else None
    if problem:
        # keep the default so that one bad --set gives one diagnostic
        ctx.err("E111", f"--set {p.name}={_shorten(raw)}: parameter '{p.name}' is {type_text or want} but the value is {problem}",
                 p.name_span)
        return value
    return new


def _check_buffer_scores(ctx: CheckContext) -> None:
    """A buffer's `score` must be a number variable of every game that replays it."""
    sv = ctx.session_vars
    for b in ctx.exp.buffers:
        if b.score is None:
            continue
        replaying = [g for g in ctx.exp.games if isinstance(g.iter, ir.Ref) and g.iter.name == b.name]
        if not replaying and b.eviction in ("solved", "no_peak", "solved_or_no_peak"):
            # the score of a replay decides these evictions: without a replay none happens
            ctx.err("E406", f"eviction = {b.eviction} of buffer '{b.name}' evicts after replays, but no game "
                     f"replays the buffer", ctx.buffer_score_spans[b.name],
                     f"add a game that iterates over it (game practice for q in {b.name} {{ ... }}), or use "
                     f"eviction = oldest")
        for g in replaying:
            t = sv.get(g.name, {}).get(b.score)
            if t is None:
                ctx.err("E101", f"score '{b.score}' is not a variable of game '{g.name}', which replays buffer '{b.name}'",
                         ctx.buffer_score_spans[b.name])
            elif t.name not in ("number", "any"):
                ctx.err("E201", f"score '{b.score}' must be a number, found {t}", ctx.buffer_score_spans[b.name])


def _check_contests_roles(ctx: CheckContext) -> None:
    for t in ctx.exp.tournaments:
        if t.judge:
            ctx.used.add(("role", t.judge))
    for j in ctx.exp.judges:
        if j.judge:
            ctx.used.add(("role", j.judge))


def _warn_unused(ctx: CheckContext) -> None:
    for (kind, name), span in ctx.decl_spans.items():
        if kind in ("game", "metric", "stage"):
            continue
        if (kind, name) in ctx.used or (kind == "param" and name in ctx.profile_names):
            continue
        if kind == "model" and any(name in _strings(v) for v in ctx.params.values()):
            continue  # named by a parameter (e.g. a boundary model set)
        if kind == "contest":
            kind = "tournament" if any(t.name == name for t in ctx.exp.tournaments) else "judge"
        ctx.sink.warn("W501", f"{kind} '{name}' is never used", span)


def _shorten(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _type_problem(value: Any, want: T, want_text: str) -> str | None:
    """Why a constant does not fit a declared parameter type (None when it fits)."""
    vt = from_json_value(value)
    if not is_a(vt, want):
        return f"{vt} {_shorten(json.dumps(value))}" if not isinstance(value, (list, dict)) else str(vt)
    if want_text == "int" and isinstance(value, float) and value != int(value):
        return f"the fraction {value}"
    return None


def _zero(t: T) -> Any:
    return {"number": 0, "bool": False, "string": "", "list": [], "record": {}}.get(t.name)


def _strings(v: Any) -> set[str]:
    if isinstance(v, str):
        return {v}
    if isinstance(v, list):
        return set().union(*(_strings(x) for x in v)) if v else set()
    if isinstance(v, dict):
        return set().union(*(_strings(x) for x in v.values())) if v else set()
    return set()
