"""The compile pipeline: read -> parse -> collect declarations -> check and lower each
declaration -> check games -> warnings for unused declarations -> IR.

`compile_file` never raises for user input: every problem becomes a Diagnostic."""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..ir import model as ir
from . import ast as A
from . import profiles
from .stages import StageChecks
from .consts import INVALID, NotConstant, OutOfRange, TooLarge, const_eval, parse_override
from ..diagnostics import Diagnostic, DiagnosticSink, Sources
from .exprs import irspan, suggest, suggestion_budget
from .games import GameChecker
from .parser import decode_source, parse, read_source
from .plan_check import check_plan_size, check_training_size
from .training import lower_training
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


class Compiler(StageChecks):
    """Checks one module and builds its IR; a pass per declaration kind (models and roles
    in roles.py, the other blocks in blocks.py, games in games.py; the shared state and
    helpers in checker_base.py)."""

    # -- pipeline
    def run(self, module: A.Module) -> ir.Experiment:
        selection = profiles.select(module.decls, self.profile, self.sink)
        decls = selection.decls
        # a parameter another configuration uses is not unused: one a profile mentions
        # (PasoDoble's online_steps in the offline profile) or one the schedule that the
        # selected profile replaced mentions (its T_P, T_S in the online profile)
        self.profile_names = {n for d in module.decls if isinstance(d, A.ProfileDecl) or (
            isinstance(d, A.BlockDecl) and d.kind == "schedule" and d not in decls) for n in A.names_in(d)}
        if selection.profile is not None:
            self.exp.options["profile"] = selection.profile  # the IR is this configuration's
        experiments = [d for d in decls if isinstance(d, A.Experiment)]
        if len(experiments) > 1:
            self.err("E104", "only one experiment block per file", experiments[1].span)
        if experiments:
            self.exp.name = experiments[0].name
            for a in experiments[0].attrs:
                if a.name == "profile":
                    continue  # the default profile: read by profiles.select
                if a.name not in EXPERIMENT_KEYS:
                    self.err("E105", f"unknown experiment setting '{a.name}'", a.name_span,
                             suggest(a.name, EXPERIMENT_KEYS) or "settings: seed, description, profile (use 'param' for the rest)")
                self.exp.options[a.name] = self.const(a.value, f"experiment setting '{a.name}'")
        params = [p for e in experiments for p in e.params] + [d for d in decls if isinstance(d, A.Param)]
        for p in params:
            self.param(p)
        for key in self.overrides:
            if key not in self.params:
                self.err("E111", f"--set {key}: no parameter named '{key}'", None,
                         suggest(key, self.params) or (f"parameters: {', '.join(sorted(self.params))}" if self.params
                                                       else "this spec declares no parameters"))
        for d in decls:
            if isinstance(d, A.TemplateDecl) and self.declare("template", d.name, d.name_span):
                if self.template(d.value, f"named:{d.name}") == INVALID:
                    self.broken_templates.add(d.name)
        for d in decls:
            if isinstance(d, A.ModelDecl):
                self.declare("model", d.name, d.name_span)
        for d in decls:
            if isinstance(d, A.RoleDecl):
                for name, span in d.names:
                    if self.declare("role", name, span):
                        self.role_decls[name] = d
            elif isinstance(d, (A.DataDecl,)):
                self.declare("data", d.name, d.name_span)
            elif isinstance(d, A.BlockDecl) and d.kind != "schedule":
                self.declare(d.kind, d.name, d.name_span)
        declared_data = [d.name for d in decls if isinstance(d, A.DataDecl)]
        for key in self.data_files:
            if key not in declared_data:
                self.err("E111", f"--data {key}: no data block named '{key}'", None,
                         suggest(key, declared_data) or (f"data blocks: {', '.join(declared_data)}" if declared_data
                                                         else "this spec declares no data block"))
        self.models([d for d in decls if isinstance(d, A.ModelDecl)])
        for d in decls:
            if isinstance(d, A.RoleDecl):
                self.role(d)
        self.check_conversations()
        for d in decls:
            if isinstance(d, A.DataDecl):
                self.data(d)
            elif isinstance(d, A.BlockDecl) and d.kind != "schedule":
                self.BLOCKS[d.kind](self, d)
        self.schedule_rewarded = self.nested_rewarded(decls)
        games = [d for d in decls if isinstance(d, A.GameDecl)]
        # games a retrain stage samples its items with: their replies are data, never trained on (no E402);
        # a misspelt or bracketed `sample` is the stage's error alone, not also E402 on the game it meant
        self.sample_games = set()
        for d in decls:
            for a in d.attrs if isinstance(d, A.StageDecl) else []:
                if a.name == "sample":
                    names = a.value.items if isinstance(a.value, A.ListLit) else [a.value]
                    self.sample_games |= {meant_game(x.id if isinstance(x, A.Name) else x.value, games)
                                          for x in names if isinstance(x, (A.Name, A.String))}
        if not games:
            # an empty file (or one holding only declarations) would run nothing at all
            self.err("E114", "nothing to run: the spec declares no game", Span(self.path, 1, 1, 1, 2),
                     "a game plays the sessions: game NAME { ask ROLE }; see docs/language.md#game")
        for g in games:
            if self.declare("game", g.name, g.name_span):
                self.exp.games.append(GameChecker(self, g).run())
        check_plan_size(self.exp, {g.name: g.name_span for g in games}, self.sink)
        for d in decls:
            if isinstance(d, A.TrainDecl):
                self.train(d)
        self.check_buffer_scores()
        schedules = [d for d in decls if isinstance(d, A.BlockDecl) and d.kind == "schedule"]
        if len(schedules) > 1:
            self.err("E104", "only one schedule per experiment", schedules[1].span)
        if schedules:
            self.block_schedule(schedules[0])
        self.stages([d for d in decls if isinstance(d, A.StageDecl)])
        lower_training(self.exp, self.written_training)
        check_training_size(self.exp, {d.role: {"": d.span, **{a.name: a.value.span for a in d.attrs}}
                                       for d in decls if isinstance(d, A.TrainDecl)}, self.sink)
        metrics = [d for d in decls if isinstance(d, A.MetricDecl)]
        for m in metrics:
            if self.declare("metric", m.name, m.name_span):
                self.metric(m)
        self.check_contests_roles()
        self.warn_quantized_trained()
        self.warn_unused(module)
        self.exp.templates = dict(sorted(self.templates.items()))
        return self.exp

    def nested_rewarded(self, decls: list) -> set[str]:
        """The role whose reward the schedule supplies: a nested schedule's outer role with
        the grounded outer reward (the inner loop's accuracy gain), exempt from E402."""
        for d in decls:
            if isinstance(d, A.BlockDecl) and d.kind == "schedule" and d.name == "nested":
                attrs = {a.name: a.value for a in d.attrs}
                how = attrs.get("outer_reward")
                value = "grounded" if how is None else (
                    how.id if isinstance(how, A.Name) and how.id not in self.params else self.params.get(getattr(how, "id", ""), ""))
                outer = attrs.get("outer")
                if value == "grounded" and isinstance(outer, A.Name):
                    return {outer.id}
        return set()

    # -- params
    def param(self, p: A.Param) -> None:
        if not self.declare("param", p.name, p.name_span):
            return
        declared = parse_type(p.type, self.sink)
        type_text = str(p.type) if p.type is not None and declared is not None else None
        value = self.const(p.default, f"the default of parameter '{p.name}'")
        if value is not None and declared is not None and type_text is not None:
            problem = _type_problem(value, declared, type_text)
            if problem:
                self.err("E201", f"parameter '{p.name}' is {type_text} but its default is {problem}", p.default.span)
                value = _zero(declared)  # a well-typed stand-in, so uses do not report again
                self.broken_params.add(p.name)  # and no setting built from it is judged by that stand-in
        if p.name in self.overrides:
            value = self.override(p, declared, type_text, value)
        t = declared or (from_json_value(value) if value is not None else ANY)
        self.params[p.name] = value
        self.param_types[p.name] = t
        self.param_spans[p.name] = p.name_span
        self.exp.params.append(ir.Param(span=irspan(p.span), name=p.name, type=type_text or str(t), value=value))

    def override(self, p: A.Param, declared: T | None, type_text: str | None, value: Any) -> Any:
        """The value of `--set NAME=RAW` for parameter `p`, or its default when it does not fit."""
        raw = self.overrides[p.name]
        try:
            expr = parse_override(raw)
            new = const_eval(expr, self.params) if expr is not None else raw
        except (OutOfRange, TooLarge) as nc:
            self.err("E111", f"--set {p.name}={_shorten(raw)}: {nc.why}", p.name_span)
            return value
        except NotConstant:
            new = raw  # a bare word is a string: --set routing=pointwise
        want = declared or (from_json_value(value) if value is not None else None)
        problem = _type_problem(new, want, type_text or str(want)) if want is not None else None
        if problem:
            # keep the default so that one bad --set gives one diagnostic
            self.err("E111", f"--set {p.name}={_shorten(raw)}: parameter '{p.name}' is {type_text or want} but the value is {problem}",
                     p.name_span)
            return value
        return new

    # -- cross checks
    def check_buffer_scores(self) -> None:
        """A buffer's `score` must be a number variable of every game that replays it."""
        sv = self.session_vars
        for b in self.exp.buffers:
            if b.score is None:
                continue
            replaying = [g for g in self.exp.games if isinstance(g.iter, ir.Ref) and g.iter.name == b.name]
            if not replaying and b.eviction in ("solved", "no_peak", "solved_or_no_peak"):
                # the score of a replay decides these evictions: without a replay none happens
                self.err("E406", f"eviction = {b.eviction} of buffer '{b.name}' evicts after replays, but no game "
                         f"replays the buffer", self.buffer_score_spans[b.name],
                         f"add a game that iterates over it (game practice for q in {b.name} {{ ... }}), or use "
                         f"eviction = oldest")
            for g in replaying:
                t = sv.get(g.name, {}).get(b.score)
                if t is None:
                    self.err("E101", f"score '{b.score}' is not a variable of game '{g.name}', which replays buffer '{b.name}'",
                             self.buffer_score_spans[b.name])
                elif t.name not in ("number", "any"):
                    self.err("E201", f"score '{b.score}' must be a number, found {t}", self.buffer_score_spans[b.name])

    def check_contests_roles(self) -> None:
        for t in self.exp.tournaments:
            if t.judge:
                self.used.add(("role", t.judge))
        for j in self.exp.judges:
            if j.judge:
                self.used.add(("role", j.judge))

    def warn_unused(self, module: A.Module) -> None:
        for (kind, name), span in self.decl_spans.items():
            if kind in ("game", "metric", "stage"):
                continue
            if (kind, name) in self.used or (kind == "param" and name in self.profile_names):
                continue
            if kind == "model" and any(name in _strings(v) for v in self.params.values()):
                continue  # named by a parameter (e.g. a boundary model set)
            if kind == "contest":
                kind = "tournament" if any(t.name == name for t in self.exp.tournaments) else "judge"
            self.sink.warn("W501", f"{kind} '{name}' is never used", span)


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
