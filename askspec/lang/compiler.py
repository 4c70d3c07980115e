"""The compile pipeline: read -> parse -> collect declarations -> check and lower each
declaration -> check games -> warnings for unused declarations -> IR.

`compile_file` never raises for user input: every problem becomes a Diagnostic."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..ir import model as ir
from . import ast as A
from .consts import NotConstant, const_eval, parse_override
from .diagnostics import DiagnosticSink, Sources
from .exprs import ExprChecker, Scope, Sym, irspan, suggest
from .games import GameChecker
from .parser import decode_source, parse
from .span import Span
from .templates import LoadedTemplate, load_template
from .types import ANY, BOOL, NUM, OPEN_RECORD, STR, T, TYPE_NAMES, from_json_value, is_a, list_of, record, reply_type

# Stands for a template or model reference that was already reported as invalid, so later
# checks do not report it as missing. Only ever appears in IR that has errors (discarded).
INVALID = "!invalid"

SAMPLING_KEYS = {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "repetition_penalty", "max_tokens", "stop", "seed"}
WHOLE_SAMPLING_KEYS = {"top_k", "max_tokens", "seed"}
MODEL_OPTION_KEYS = {"base_url", "api_key_env", "concurrency", "timeout", "retries", "max_batch", "file"}
BACKENDS = {"hf", "openai", "vllm", "python", "replay"}
ROLE_KEYS = {"model", "memory", "system", "prompt", "reply", "require", "recover", "recover_truncated",
             "recover_malformed", "retries", "max_tokens"} | (SAMPLING_KEYS - {"max_tokens"})
ALGORITHMS = {"grpo", "rloo", "reinforce", "reinforce_baseline", "ppo", "gspo", "cispo", "dr_grpo", "group_norm", "sft"}
EXPERIMENT_KEYS = {"seed", "description"}
SCHEDULES = {"online", "alternating", "nested"}
NESTED_KEYS = ["outer", "inner", "copies", "inner_steps", "outer_steps", "datasets", "promotion_window",
               "promotion_threshold", "games"]
EVICTIONS = {"oldest", "none", "solved", "no_peak", "solved_or_no_peak"}


@dataclass
class CompileResult:
    ir: ir.Experiment | None
    sink: DiagnosticSink
    sources: Sources
    files: dict[str, str] = field(default_factory=dict)  # spec + prompt files as read (relative paths)

    @property
    def ok(self) -> bool:
        return self.ir is not None and not self.sink.has_errors


def compile_file(path: str, overrides: dict[str, str] | None = None) -> CompileResult:
    sink, sources = DiagnosticSink(), Sources()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        sink.error("E004", f"cannot read {path}: {e.strerror or e}", None)
        return CompileResult(None, sink, sources)
    return compile_bytes(path, data, overrides, sink, sources)


def compile_source(path: str, text: str, overrides: dict[str, str] | None = None) -> CompileResult:
    return compile_bytes(path, text.encode("utf-8", "surrogatepass"), overrides)


def compile_bytes(path: str, data: bytes, overrides: dict[str, str] | None = None,
                  sink: DiagnosticSink | None = None, sources: Sources | None = None) -> CompileResult:
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
        exp = Compiler(path, sink, sources, files, overrides or {}).run(module)
        return CompileResult(None if sink.has_errors else exp, sink, sources, files)
    except RecursionError:
        sink.error("E005", "spec nested too deeply to compile", Span(path, 1, 1, 1, 2))
    except Exception as e:  # the last line of defence: never show a traceback
        if os.environ.get("ASKSPEC_DEBUG"):
            raise
        sink.error("E999", f"internal compiler error: {e.__class__.__name__}: {e}", Span(path, 1, 1, 1, 2))
    return CompileResult(None, sink, sources)


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
    def __init__(self, path: str, sink: DiagnosticSink, sources: Sources, files: dict[str, str], overrides: dict[str, str]) -> None:
        self.path = path
        self.spec_dir = os.path.dirname(os.path.abspath(path))
        self.sink = sink
        self.sources = sources
        self.files = files
        self.overrides = overrides
        self.params: dict[str, Any] = {}
        self.param_types: dict[str, T] = {}
        self.param_spans: dict[str, Span] = {}
        self.templates: dict[str, ir.Template] = {}
        self.loaded: dict[str, LoadedTemplate] = {}
        self.decl_spans: dict[tuple[str, str], Span] = {}
        self.used: set[tuple[str, str]] = set()
        self.role_decls: dict[str, A.RoleDecl] = {}
        self.buffer_score_spans: dict[str, Span] = {}
        self.broken_templates: set[str] = set()  # named templates that failed to load
        self.session_vars: dict[str, dict[str, T]] = {}  # game -> its session variables (set by GameChecker)
        self.exp = ir.Experiment(name=os.path.splitext(os.path.basename(path))[0])

    # -- shared helpers
    def err(self, code: str, msg: str, span: Span | None, hint: str | None = None) -> None:
        self.sink.error(code, msg, span, hint)

    def declare(self, kind: str, name: str, span: Span) -> bool:
        key = (kind if kind not in ("tournament", "judge") else "contest", name)
        if key in self.decl_spans:
            prev = self.decl_spans[key]
            d = self.sink.error("E104", f"{kind} '{name}' is declared twice", span)
            d.notes.append(("first declared here", prev))
            return False
        self.decl_spans[key] = span
        return True

    def const(self, e: A.Expr, what: str) -> Any:
        for n in A.names_in(e):
            if n in self.params:
                self.used.add(("param", n))
        try:
            return const_eval(e, self.params)
        except NotConstant as nc:
            self.err("E107", f"{what} must be a constant: {nc.why}", nc.node.span)
            return None

    def const_int(self, e: A.Expr, what: str, minimum: int = 0) -> int | None:
        v = self.const(e, what)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
            self.err("E107", f"{what} must be a whole number ≥ {minimum}, found {v!r}", e.span)
            return None
        return int(v)

    def template(self, e: A.Expr, name: str | None = None) -> str | None:
        if isinstance(e, A.Name):
            key = f"named:{e.id}"
            if key in self.templates:
                self.used.add(("template", e.id))
                return key
            if e.id in self.broken_templates:
                return INVALID
            self.err("E110", f"unknown template '{e.id}'", e.span,
                     suggest(e.id, [k.split(":", 1)[1] for k in self.templates if k.startswith("named:")]))
            return INVALID
        lt = load_template(e, self.spec_dir, self.path, self.sink, self.files, name)
        if lt is None:
            return INVALID  # reported; keeps later checks from reporting a missing template again
        if lt.path is not None:
            self.sources.add(lt.display_path, lt.source)
        self.loaded[lt.key] = lt
        self.templates[lt.key] = ir.Template(span=irspan(e.span), name=lt.key, source=lt.source, path=lt.path, variables=lt.variables)
        return lt.key

    # -- pipeline
    def run(self, module: A.Module) -> ir.Experiment:
        decls = module.decls
        experiments = [d for d in decls if isinstance(d, A.Experiment)]
        if len(experiments) > 1:
            self.err("E104", "only one experiment block per file", experiments[1].span)
        if experiments:
            self.exp.name = experiments[0].name
            for a in experiments[0].attrs:
                if a.name not in EXPERIMENT_KEYS:
                    self.err("E105", f"unknown experiment setting '{a.name}'", a.name_span,
                             suggest(a.name, EXPERIMENT_KEYS) or "settings: seed, description (use 'param' for the rest)")
                self.exp.options[a.name] = self.const(a.value, f"experiment setting '{a.name}'")
        params = [p for e in experiments for p in e.params] + [d for d in decls if isinstance(d, A.Param)]
        for p in params:
            self.param(p)
        for key in self.overrides:
            if key not in self.params:
                self.err("E111", f"--set {key}: no parameter named '{key}'", None)
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
        self.models([d for d in decls if isinstance(d, A.ModelDecl)])
        for d in decls:
            if isinstance(d, A.RoleDecl):
                self.role(d)
        for d in decls:
            if isinstance(d, A.DataDecl):
                self.data(d)
            elif isinstance(d, A.BlockDecl) and d.kind != "schedule":
                getattr(self, "block_" + d.kind)(d)
        games = [d for d in decls if isinstance(d, A.GameDecl)]
        for g in games:
            if self.declare("game", g.name, g.name_span):
                self.exp.games.append(GameChecker(self, g).run())
        for d in decls:
            if isinstance(d, A.TrainDecl):
                self.train(d)
        self.check_buffer_scores()
        schedules = [d for d in decls if isinstance(d, A.BlockDecl) and d.kind == "schedule"]
        if len(schedules) > 1:
            self.err("E104", "only one schedule per experiment", schedules[1].span)
        if schedules:
            self.block_schedule(schedules[0])
        metrics = [d for d in decls if isinstance(d, A.MetricDecl)]
        for m in metrics:
            if self.declare("metric", m.name, m.name_span):
                self.metric(m)
        self.check_contests_roles()
        self.warn_unused(module)
        self.exp.templates = dict(sorted(self.templates.items()))
        return self.exp

    # -- params
    def param(self, p: A.Param) -> None:
        if not self.declare("param", p.name, p.name_span):
            return
        declared = parse_type(p.type, self.sink)
        type_text = str(p.type) if p.type is not None and declared is not None else None
        value = self.const(p.default, f"the default of parameter '{p.name}'")
        if value is not None and declared is not None:
            problem = _type_problem(value, declared, type_text)
            if problem:
                self.err("E201", f"parameter '{p.name}' is {type_text} but its default is {problem}", p.default.span)
                value = _zero(declared)  # a well-typed stand-in, so uses do not report again
        if p.name in self.overrides:
            raw = self.overrides[p.name]
            expr = parse_override(raw)
            try:
                new = const_eval(expr, self.params) if expr is not None else raw
            except NotConstant:
                new = raw  # a bare word is a string: --set routing=pointwise
            want = declared or (from_json_value(value) if value is not None else None)
            problem = _type_problem(new, want, type_text or str(want)) if want is not None else None
            if problem:
                # keep the default so that one bad --set gives one diagnostic
                self.err("E111", f"--set {p.name}={raw}: parameter '{p.name}' is {type_text or want} but the value is {problem}",
                         p.name_span)
            else:
                value = new
        t = declared or (from_json_value(value) if value is not None else ANY)
        self.params[p.name] = value
        self.param_types[p.name] = t
        self.param_spans[p.name] = p.name_span
        self.exp.params.append(ir.Param(span=irspan(p.span), name=p.name, type=type_text or str(t), value=value))

    # -- models
    def models(self, decls: list[A.ModelDecl]) -> None:
        by_name = {d.name: d for d in decls}
        done: dict[str, ir.Model] = {}
        visiting: set[str] = set()

        def build(d: A.ModelDecl) -> ir.Model | None:
            if d.name in done:
                return done[d.name]
            if d.name in visiting:
                self.err("E107", f"model '{d.name}' derives from itself", d.base.span)
                return None
            visiting.add(d.name)
            base = d.base
            if isinstance(base, A.Name):
                parent_decl = by_name.get(base.id)
                if parent_decl is None:
                    self.err("E103", f"unknown model '{base.id}'", base.span, suggest(base.id, by_name))
                    return None
                self.used.add(("model", base.id))
                parent = build(parent_decl)
                if parent is None:
                    return None
                m = parent.model_copy(deep=True, update={"name": d.name, "derived_from": base.id, "span": irspan(d.span)})
            elif isinstance(base, A.Call) and base.func in BACKENDS:
                weights = ""
                if base.args:
                    w = self.const(base.args[0], "model weights")
                    if not isinstance(w, str):
                        self.err("E107", "model weights must be a string", base.args[0].span)
                    else:
                        weights = w
                if len(base.args) > 1:
                    self.err("E109", f"{base.func}() takes the weights and keyword options", base.span)
                if base.func in ("python", "replay") and not weights:
                    need = 'callable "module:function"' if base.func == "python" else "replay file path"
                    self.err("E107", f"{base.func}() needs a {need}", base.span)
                if base.func == "python" and weights and ":" not in weights:
                    self.err("E107", "a python model names its callable as \"package.module:function\"", base.args[0].span)
                m = ir.Model(span=irspan(d.span), name=d.name, backend=base.func, weights=weights)
                for k, v in base.kwargs:
                    self.model_attr(m, k, v, base.span)
            else:
                what = base.func if isinstance(base, A.Call) else type(base).__name__.lower()
                self.err("E107", f"a model is a backend call such as hf(\"weights\") or another model's name, not {what}",
                         base.span, f"backends: {', '.join(sorted(BACKENDS))}")
                return None
            for a in d.attrs:
                self.model_attr(m, a.name, a.value, a.name_span)
            visiting.discard(d.name)
            done[d.name] = m
            return m

        for d in decls:
            m = build(d)
            if m is not None and all(x.name != m.name for x in self.exp.models):
                self.exp.models.append(m)
        self.exp.models.sort(key=lambda m: [d.name for d in decls].index(m.name))

    def sampling_value(self, key: str, value: A.Expr) -> Any:
        """A sampling field's constant value (models and roles), or None if invalid."""
        v = self.const(value, f"sampling field '{key}'")
        if v is None:
            return None
        if key == "stop":
            v = [v] if isinstance(v, str) else v
            if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
                self.err("E107", "stop must be a string or a list of strings", value.span)
                return None
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            self.err("E201", f"'{key}' must be a number, found {from_json_value(v)}", value.span)
            return None
        elif (v < 0 and key != "presence_penalty") or (key in WHOLE_SAMPLING_KEYS and v != int(v)):
            whole = "whole " if key in WHOLE_SAMPLING_KEYS else ""
            self.err("E107", f"'{key}' must be a {whole}number ≥ 0, found {v}", value.span)
            return None
        return v

    def model_attr(self, m: ir.Model, key: str, value: A.Expr, span: Span) -> None:
        if key in SAMPLING_KEYS:
            v = self.sampling_value(key, value)
            if v is not None:
                m.sampling[key] = v
        elif key in MODEL_OPTION_KEYS:
            v = self.const(value, f"model setting '{key}'")
            m.options[key] = v
        else:
            self.err("E105", f"unknown model setting '{key}'", span, suggest(key, SAMPLING_KEYS | MODEL_OPTION_KEYS))

    # -- roles
    def role(self, d: A.RoleDecl) -> None:
        attrs = {}
        for a in d.attrs:
            if a.name in attrs:
                self.err("E104", f"role setting '{a.name}' given twice", a.name_span)
            attrs[a.name] = a
            if a.name not in ROLE_KEYS:
                self.err("E105", f"unknown role setting '{a.name}'", a.name_span, suggest(a.name, ROLE_KEYS))
        trained = False
        for f in d.flags:
            if f.name == "trained":
                trained = True
            elif f.name != "frozen":
                self.err("E105", f"unknown role flag '{f.name}'", f.span, suggest(f.name, ["trained", "frozen"]) or "flags: trained, frozen")
        for name, span in d.names:
            if any(r.name == name for r in self.exp.roles):
                continue
            r = ir.Role(span=irspan(d.span), name=name, trained=trained)
            if "model" in attrs:
                mv = attrs["model"].value
                if isinstance(mv, A.Name) and self.exp.model(mv.id) is not None:
                    r.model = mv.id
                    self.used.add(("model", mv.id))
                elif isinstance(mv, A.Name) and mv.id in ("bound", "per_session"):
                    r.model = None
                elif isinstance(mv, A.Name):
                    self.err("E103", f"unknown model '{mv.id}'", mv.span, suggest(mv.id, [m.name for m in self.exp.models]))
                    r.model = INVALID
                else:
                    self.err("E107", "a role's model is the name of a declared model", mv.span)
                    r.model = INVALID
            if "memory" in attrs:
                r.memory = self.memory(attrs["memory"].value)
            for key in ("system", "prompt"):
                if key in attrs:
                    setattr(r, key, self.template(attrs[key].value))
            if "reply" in attrs:
                r.reply = self.reply_parser(attrs["reply"].value)
            if "require" in attrs:
                req = self.const(attrs["require"].value, "require")
                req = [req] if isinstance(req, str) else req
                if not isinstance(req, list) or not all(isinstance(x, str) for x in req):
                    self.err("E107", "require is a field name or a list of them", attrs["require"].value.span)
                else:
                    for x in req:
                        if x not in r.reply.fields:
                            self.err("E202", f"require: the reply parser has no field '{x}'", attrs["require"].value.span,
                                     f"fields: {', '.join(r.reply.fields) or 'none (use sections(...), summary(...), boxed or json(...))'}")
                    r.reply.required = req
            rec = r.recover
            if "recover" in attrs:
                rv = attrs["recover"].value
                if isinstance(rv, A.Name) and rv.id == "resample":
                    rec.mode = "resample"  # rejection sampling: discard and sample again
                else:
                    rec.truncated = rec.malformed = self.template(rv)
                rec.retries = 1
            if rec.mode == "resample":
                for key in ("recover_truncated", "recover_malformed"):
                    if key in attrs:
                        self.err("E107", f"'{key}' has no use with 'recover = resample'", attrs[key].name_span)
            if "recover_truncated" in attrs:
                rec.truncated = self.template(attrs["recover_truncated"].value)
                rec.retries = max(rec.retries, 1)
            if "recover_malformed" in attrs:
                rec.malformed = self.template(attrs["recover_malformed"].value)
                rec.retries = max(rec.retries, 1)
            if "retries" in attrs:
                n = self.const_int(attrs["retries"].value, "retries")
                if n is not None:
                    rec.retries = n
            if "max_tokens" in attrs:
                r.max_tokens = self.const_int(attrs["max_tokens"].value, "max_tokens", 1)
            for key in SAMPLING_KEYS - {"max_tokens"}:
                if key in attrs:
                    v = self.sampling_value(key, attrs[key].value)
                    if v is not None:
                        r.sampling[key] = v
            self.exp.roles.append(r)

    def memory(self, e: A.Expr) -> ir.Memory:
        if isinstance(e, A.Name) and e.id in ("full", "none"):
            return ir.Memory(kind=e.id)
        if isinstance(e, A.Call) and e.func == "window" and len(e.args) == 1:
            n = self.const_int(e.args[0], "window size", 1)
            return ir.Memory(kind="window", size=n or 1)
        self.err("E107", "memory is full, none or window(N)", e.span)
        return ir.Memory()

    def reply_parser(self, e: A.Expr) -> ir.ReplyParser:
        name = e.id if isinstance(e, A.Name) else e.func if isinstance(e, A.Call) else None
        args = e.args if isinstance(e, A.Call) else []
        kwargs = dict(e.kwargs) if isinstance(e, A.Call) else {}
        if name == "text":
            return ir.ReplyParser(kind="text")
        if name == "boxed":
            return ir.ReplyParser(kind="boxed", fields=["answer"], required=["answer"])
        if name == "sections":
            tags = [self.const(a, "a section tag") for a in args]
            if not tags or not all(isinstance(t, str) and t for t in tags):
                self.err("E109", "sections() takes one or more tag strings, e.g. sections(\"#Draft#\", \"#Question#\")", e.span)
                return ir.ReplyParser(kind="text")
            fields = [section_field(t) for t in tags]
            return ir.ReplyParser(kind="sections", args={"tags": tags}, fields=fields, required=[fields[-1]])
        if name == "summary":
            after = kwargs.get("after")
            tags = self.const(after, "summary tags") if after is not None else None
            tags = ["#Summary#", "#Output#"] if tags is None else [tags] if isinstance(tags, str) else tags
            if not isinstance(tags, list) or not tags or not all(isinstance(t, str) and t for t in tags):
                self.err("E107", "after is a tag string or a list of them", after.span if after is not None else e.span)
                tags = ["#Summary#", "#Output#"]
            max_chars = (self.const_int(kwargs["max_chars"], "max_chars", 1) or 2000) if "max_chars" in kwargs else 2000
            keep = "boxed"
            if "keep" in kwargs:
                kv = kwargs["keep"]
                keep = kv.id if isinstance(kv, A.Name) else ""
                if keep not in ("boxed", "none"):
                    self.err("E107", "keep is boxed (the last \\boxed{} answer always survives the cut) or none", kv.span)
                    keep = "boxed"
            for k in kwargs:
                if k not in ("after", "max_chars", "keep"):
                    self.err("E109", f"summary() has no option '{k}'", e.span, "options: after, max_chars, keep")
            return ir.ReplyParser(kind="summary", args={"after": tags, "max_chars": max_chars, "keep": keep},
                                  fields=["summary", "answer"])
        if name == "tags":
            tags = [self.const(a, "a tag name") for a in args]
            if not tags or not all(isinstance(t, str) and t and t.replace("_", "").replace("-", "").isalnum() for t in tags):
                self.err("E109", "tags() takes one or more tag names, e.g. tags(\"question\", \"answer\")", e.span)
                return ir.ReplyParser(kind="text")
            for k in kwargs:
                if k != "boxed":
                    self.err("E109", f"tags() has no option '{k}'", e.span, "options: boxed")
            fields = [section_field(t) for t in tags]
            targs: dict = {"tags": tags}
            if "boxed" in kwargs:
                b = self.const(kwargs["boxed"], "boxed")
                if b not in tags:
                    self.err("E107", "boxed names one of the tags, whose last \\boxed{} becomes the field 'answer'", kwargs["boxed"].span)
                else:
                    targs["boxed"] = b
                    if "answer" not in fields:
                        fields.append("answer")
            return ir.ReplyParser(kind="tags", args=targs, fields=fields, required=list(fields))
        if name == "json":
            if len(args) != 1 or not isinstance(args[0], A.RecordLit):
                self.err("E109", "json() takes a schema record, e.g. json({is_correct: bool, notes: string})", e.span)
                return ir.ReplyParser(kind="text")
            schema = {}
            for k, v in args[0].fields:
                tname = v.id if isinstance(v, A.Name) else v.value if isinstance(v, A.String) else None
                if tname not in ("bool", "number", "string", "list", "any"):
                    self.err("E107", f"json schema field '{k}' must be bool, number, string, list or any", v.span)
                    tname = "any"
                schema[k] = tname
            retries = (self.const_int(kwargs["retries"], "retries") or 0) if "retries" in kwargs else 2
            return ir.ReplyParser(kind="json", args={"schema": schema, "retries": retries}, fields=list(schema), required=list(schema))
        self.err("E107", "reply is text, boxed, sections(...), tags(...), summary(...) or json({...})", e.span)
        return ir.ReplyParser(kind="text")

    def reply_types(self) -> dict[str, T]:
        out = {}
        for r in self.exp.roles:
            fields: dict[str, T] = {}
            if r.reply.kind == "json":
                m = {"bool": BOOL, "number": NUM, "string": STR, "list": list_of(ANY), "any": ANY}
                fields = {k: m[v] for k, v in r.reply.args["schema"].items()}
            else:
                fields = {f: STR for f in r.reply.fields}
            out[r.name] = reply_type(fields, r.name)
        return out

    # -- data and blocks
    def data(self, d: A.DataDecl) -> None:
        src = d.source
        opts = {}
        for a in d.attrs:
            if a.name == "fields":
                continue
            opts[a.name] = self.const(a.value, f"data setting '{a.name}'")
            if a.name not in ("limit", "shuffle", "seed", "text_field", "split"):
                self.err("E105", f"unknown data setting '{a.name}'", a.name_span, "settings: limit, shuffle, seed, text_field, split, fields")
        ds = ir.Dataset(span=irspan(d.span), name=d.name, format="list", items=[], options=opts)
        self.exp.datasets.append(ds)  # even when invalid, so that uses do not report it as undefined
        if isinstance(src, A.ListLit):
            ds.items = self.const(src, "inline data") or []
        elif isinstance(src, A.Call) and src.func in ("jsonl", "parquet", "knowledge") and len(src.args) == 1:
            path = self.const(src.args[0], "a data path")
            if not isinstance(path, str):
                if path is not None:
                    self.err("E107", "a data path is a string", src.args[0].span)
                return
            ds.format, ds.path, ds.items = src.func, path, None
            ds.digest = self.file_digest(path, src.args[0].span)
        else:
            self.err("E107", "data is jsonl(\"path\"), parquet(\"path\"), knowledge(\"path\") or a list literal", src.span)
            return
        fields = next((a for a in d.attrs if a.name == "fields"), None)
        if fields is not None:
            self.exp.datasets[-1].options["fields"] = self.field_types(fields.value)

    def file_digest(self, rel: str, span: Span) -> str | None:
        """sha256 of a data file (relative to the spec's folder), so that the experiment
        hash changes when the data does."""
        full = os.path.normpath(os.path.join(self.spec_dir, rel))
        try:
            h = hashlib.sha256()
            with open(full, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            return h.hexdigest()
        except FileNotFoundError:
            self.err("E303", f"data file not found: {rel}", span, "paths are relative to the spec's folder")
        except OSError as e:
            self.err("E303", f"cannot read data file {rel}: {e.strerror or e}", span)
        return None

    def data_item_type(self, name: str) -> T:
        buf = next((x for x in self.exp.buffers if x.name == name), None)
        if buf is not None:
            return schema_type(buf.fields) if buf.fields else OPEN_RECORD
        ds = next((x for x in self.exp.datasets if x.name == name), None)
        if ds is None:
            return ANY
        if ds.format == "list" and ds.items:
            return from_json_value(ds.items).elem or ANY
        schema = ds.options.get("fields")
        if schema:
            return schema_type(schema)
        if ds.format == "knowledge":
            return record({"text": STR, "id": ANY})
        return OPEN_RECORD

    def _attrs(self, d: A.BlockDecl, allowed: set[str], required: set[str]) -> dict[str, A.Attribute]:
        attrs = {}
        for a in d.attrs:
            if a.name not in allowed:
                self.err("E105", f"unknown {d.kind} setting '{a.name}'", a.name_span, suggest(a.name, allowed) or f"settings: {', '.join(sorted(allowed))}")
            attrs[a.name] = a
        for r in sorted(required - set(attrs)):
            self.err("E106", f"{d.kind} '{d.name}' needs a '{r}' setting", d.name_span)
        return attrs

    def role_ref(self, e: A.Expr) -> str | None:
        if isinstance(e, A.Name) and any(r.name == e.id for r in self.exp.roles):
            return e.id
        if isinstance(e, A.Name):
            self.err("E102", f"unknown role '{e.id}'", e.span, suggest(e.id, [r.name for r in self.exp.roles]))
        else:
            self.err("E107", "expected a role name", e.span)
        return None

    def block_buffer(self, d: A.BlockDecl) -> None:
        a = self._attrs(d, {"capacity", "eviction", "patience", "fields", "score"}, {"capacity"})
        cap = self.const_int(a["capacity"].value, "capacity", 1) if "capacity" in a else None
        buf = ir.Buffer(span=irspan(d.span), name=d.name, capacity=cap or 1)
        if "eviction" in a:
            v = a["eviction"].value
            ev = v.id if isinstance(v, A.Name) and v.id not in self.params else self.const(v, "eviction")
            if ev not in EVICTIONS:
                self.err("E107", f"eviction is {', '.join(sorted(EVICTIONS))}", v.span)
            else:
                buf.eviction = ev
        if "patience" in a:
            buf.options["patience"] = self.const_int(a["patience"].value, "patience", 1)
        if "fields" in a:
            buf.fields = self.field_types(a["fields"].value)
        if "score" in a:
            v = a["score"].value
            if isinstance(v, A.Name):
                buf.score = v.id
                self.buffer_score_spans[d.name] = v.span
            else:
                self.err("E107", "score names a session variable of the game that replays the buffer", v.span)
        if buf.eviction in ("solved", "no_peak", "solved_or_no_peak") and buf.score is None:
            self.err("E106", f"buffer '{d.name}' needs a 'score' setting for eviction = {buf.eviction}", d.name_span,
                     "name the replaying game's accuracy variable: score = acc")
        self.exp.buffers.append(buf)

    def field_types(self, e: A.Expr) -> dict[str, str]:
        """A `fields = {name: type, ...}` setting (data sets and buffers)."""
        if not isinstance(e, A.RecordLit):
            self.err("E107", "fields is a record of field types, e.g. {question: string, answer: string}", e.span)
            return {}
        schema = {}
        for k, v in e.fields:
            tname = v.id if isinstance(v, A.Name) else None
            if tname not in TYPE_NAMES and tname != "list":
                self.err("E107", f"unknown type for field '{k}'", v.span, "types: number, bool, string, list, any")
                tname = "any"
            schema[k] = tname
        return schema

    def block_tournament(self, d: A.BlockDecl) -> None:
        a = self._attrs(d, {"judge", "prompt", "pairing", "verdict", "gamma", "aggregate", "order", "retries"}, {"judge", "prompt"})
        judge = self.role_ref(a["judge"].value) if "judge" in a else None
        tpl = self.template(a["prompt"].value) if "prompt" in a else None
        t = ir.Tournament(span=irspan(d.span), name=d.name, judge=judge or "", template=tpl or "")
        if "pairing" in a:
            v = a["pairing"].value
            if isinstance(v, A.Name) and v.id in ("round_robin", "live"):
                t.pairing = v.id
            elif isinstance(v, A.Call) and v.func == "live":
                opp = [x.id for x in v.args if isinstance(x, A.Name)]
                if len(opp) != len(v.args) or not opp or any(o not in ("best", "worst", "median") for o in opp):
                    self.err("E107", "live(...) takes best, worst and/or median", v.span)
                else:
                    t.pairing, t.live_opponents = "live", opp
            else:
                self.err("E107", "pairing is round_robin or live(best, worst, median)", v.span)
        if "verdict" in a:
            v = a["verdict"].value
            if isinstance(v, A.Call) and v.func == "boxed" and len(v.args) == 3:
                labels = [self.const(x, "a verdict label") for x in v.args]
                if all(isinstance(x, str) for x in labels):
                    t.verdicts = labels
            else:
                self.err("E107", "verdict is boxed(\"A\", \"B\", \"Tie\") (first wins, second wins, tie)", v.span)
        if "gamma" in a:
            g = self.const(a["gamma"].value, "gamma")
            if not isinstance(g, (int, float)) or isinstance(g, bool) or not 0.5 <= g <= 1:
                self.err("E107", "gamma is a number between 0.5 and 1", a["gamma"].value.span)
            else:
                t.gamma = float(g)
        if "aggregate" in a:
            v = a["aggregate"].value
            if isinstance(v, A.Name) and v.id in ("win_rate", "bradley_terry"):
                t.aggregate = v.id
            else:
                self.err("E107", "aggregate is win_rate or bradley_terry", v.span)
        if "order" in a:
            v = a["order"].value
            if isinstance(v, A.Name) and v.id in ("random", "both", "fixed"):
                t.order = v.id
            else:
                self.err("E107", "order is random (the paper's debiasing), both (every pair judged in both orders) or fixed", v.span)
        if "retries" in a:
            t.retries = self.const_int(a["retries"].value, "retries") or 0
        self.exp.tournaments.append(t)

    def block_judge(self, d: A.BlockDecl) -> None:
        a = self._attrs(d, {"judge", "prompt", "scores", "retries"}, {"judge", "prompt"})
        judge = self.role_ref(a["judge"].value) if "judge" in a else None
        tpl = self.template(a["prompt"].value) if "prompt" in a else None
        j = ir.PointwiseJudge(span=irspan(d.span), name=d.name, judge=judge or "", template=tpl or "")
        if "scores" in a:
            s = self.const(a["scores"].value, "scores")
            if not isinstance(s, list) or not s or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in s):
                self.err("E107", "scores is a list of numbers", a["scores"].value.span)
            else:
                j.scores = [float(x) for x in s]
        if "retries" in a:
            j.retries = self.const_int(a["retries"].value, "retries") or 0
        self.exp.judges.append(j)

    def block_schedule(self, d: A.BlockDecl) -> None:
        if d.name not in SCHEDULES:
            self.err("E405", f"unknown schedule '{d.name}'", d.name_span, suggest(d.name, SCHEDULES) or f"schedules: {', '.join(sorted(SCHEDULES))}")
            return
        opts: dict[str, Any] = {}
        roles = {r.name for r in self.exp.roles}
        trained = {r.name for r in self.exp.roles if r.trained}
        for a in d.attrs:
            if a.name in opts:
                self.err("E104", f"schedule setting '{a.name}' given twice", a.name_span)
            if a.name == "games":
                opts["games"] = self.schedule_games(a.value, d.name)
            elif d.name == "alternating" and a.name == "iterations":
                opts[a.name] = self.const_int(a.value, a.name, 1)
            elif d.name == "alternating":
                if a.name not in roles:
                    self.err("E102", f"unknown role '{a.name}' in alternating schedule", a.name_span, suggest(a.name, roles))
                elif a.name not in trained:
                    self.err("E405", f"role '{a.name}' has a training phase but is not marked 'trained'", a.name_span)
                opts[a.name] = self.const_int(a.value, f"steps for {a.name}", 1)
            elif d.name == "nested":
                if a.name in ("outer", "inner"):
                    opts[a.name] = self.role_ref(a.value)
                    if opts[a.name] is not None and opts[a.name] not in trained:
                        self.err("E405", f"the {a.name} role of a nested schedule must be marked 'trained'", a.value.span)
                elif a.name in ("copies", "inner_steps", "outer_steps", "datasets", "promotion_window"):
                    opts[a.name] = self.const_int(a.value, a.name, 1)
                elif a.name == "promotion_threshold":
                    v = self.const(a.value, a.name)
                    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                        self.err("E201", f"promotion_threshold must be a number, found {from_json_value(v)}", a.value.span)
                    opts[a.name] = v
                else:
                    self.err("E105", f"unknown nested schedule setting '{a.name}'", a.name_span,
                             suggest(a.name, NESTED_KEYS) or f"settings: {', '.join(NESTED_KEYS)}")
            else:
                if a.name != "steps":
                    self.err("E105", f"unknown online schedule setting '{a.name}'", a.name_span, "settings: steps, games")
                opts[a.name] = self.const_int(a.value, a.name, 1)
        if d.name == "nested":
            for need in ("outer", "inner"):
                if need not in opts:
                    self.err("E106", f"a nested schedule needs '{need}'", d.name_span)
        if d.name == "alternating" and not any(k in roles for k in opts):
            self.err("E106", "an alternating schedule needs the steps of each phase, e.g. proposer = 10", d.name_span)
        self.exp.schedule = ir.Schedule(span=irspan(d.span), kind=d.name, options=opts)

    def schedule_games(self, e: A.Expr, kind: str) -> Any:
        """`games = [g1, g2]` (which games run), or for alternating schedules
        `games = {role: game_or_list, ...}` (which games run in each role's phase)."""
        names = {g.name for g in self.exp.games}

        def game_list(v: A.Expr) -> list[str]:
            items = v.items if isinstance(v, A.ListLit) else [v]
            out = []
            for x in items:
                if not isinstance(x, A.Name):
                    self.err("E107", "expected a game name", x.span)
                elif x.id not in names:
                    self.err("E110", f"unknown game '{x.id}'", x.span, suggest(x.id, names))
                else:
                    out.append(x.id)
            return out

        if kind == "alternating" and isinstance(e, A.RecordLit):
            roles = {r.name for r in self.exp.roles}
            out = {}
            for k, v in e.fields:
                if k not in roles:
                    self.err("E102", f"unknown role '{k}'", v.span, suggest(k, roles))
                out[k] = game_list(v)
            return out
        return game_list(e)

    # -- training
    def train(self, d: A.TrainDecl) -> None:
        role = next((r for r in self.exp.roles if r.name == d.role), None)
        if role is None:
            self.err("E102", f"unknown role '{d.role}'", d.role_span, suggest(d.role, [r.name for r in self.exp.roles]))
            return
        self.used.add(("role", d.role))
        if not role.trained:
            self.err("E405", f"role '{d.role}' is trained here but not marked 'trained'", d.role_span, f"add the flag: role {d.role} {{ trained ... }}")
        algo_e = d.algo
        name = algo_e.id if isinstance(algo_e, A.Name) else algo_e.func if isinstance(algo_e, A.Call) else None
        if name not in ALGORITHMS:
            self.err("E405", f"unknown training algorithm '{name}'", algo_e.span, f"algorithms: {', '.join(sorted(ALGORITHMS))}")
            return
        args = {k: self.const(v, k) for k, v in (algo_e.kwargs if isinstance(algo_e, A.Call) else [])}
        hyper = {}
        for a in d.attrs:
            if a.name == "replay":
                if not (isinstance(a.value, A.Name) and any(b.name == a.value.id for b in self.exp.buffers)):
                    self.err("E110", "replay names a declared buffer", a.value.span)
                else:
                    self.used.add(("buffer", a.value.id))
                    hyper["replay"] = a.value.id
                continue
            hyper[a.name] = self.const(a.value, f"training setting '{a.name}'")
        self.exp.training.append(ir.Training(span=irspan(d.span), role=d.role, algorithm=name, algorithm_args=args, hyper=hyper))

    # -- metrics
    def metric(self, m: A.MetricDecl) -> None:
        outcomes = {o for g in self.exp.games for o in g.outcomes}
        scope = Scope()
        for p, t in self.param_types.items():
            scope.define(p, Sym("param", t, None, used=True))
        for r in self.exp.roles:
            scope.define(r.name, Sym("role", T("role", role=r.name), None, used=True))
        scope.define("outcome", Sym("var", T("outcome"), None, used=True))
        scope.define("status", Sym("var", STR, None, used=True))
        scope.define("game", Sym("var", STR, None, used=True))
        for g in self.exp.games:
            for name, t in self.session_vars.get(g.name, {}).items():
                scope.define(name, Sym("var", t, None, used=True))
        checker = ExprChecker(self.sink, outcomes, metric=True)
        checker.role_reply = self.reply_types()
        value, _ = checker.check(m.value, scope)
        for n in A.names_in(m.value) | {name for name, _ in m.by}:
            if n in self.params:
                self.used.add(("param", n))
        by = []
        for name, span in m.by:
            if scope.lookup(name) is None or scope.lookup(name).kind == "role":
                self.err("E101", f"cannot group by '{name}': not a session variable", span,
                         suggest(name, [n for n in scope.all_names() if scope.lookup(n).kind != "role"]))
            by.append(name)
        self.exp.metrics.append(ir.Metric(span=irspan(m.span), name=m.name, value=value, by=by))

    # -- cross checks
    def check_buffer_scores(self) -> None:
        """A buffer's `score` must be a number variable of every game that replays it."""
        sv = self.session_vars
        for b in self.exp.buffers:
            if b.score is None:
                continue
            replaying = [g for g in self.exp.games if g.iter is not None and getattr(g.iter, "kind", "") == "ref"
                         and g.iter.name == b.name]
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
            if kind in ("game", "metric"):
                continue
            if (kind, name) in self.used:
                continue
            if kind == "model" and any(name in _strings(v) for v in self.params.values()):
                continue  # named by a parameter (e.g. a boundary model set)
            if kind == "contest":
                kind = "tournament" if any(t.name == name for t in self.exp.tournaments) else "judge"
            self.sink.warn("W501", f"{kind} '{name}' is never used", span)


def _type_problem(value: Any, want: T, want_text: str) -> str | None:
    """Why a constant does not fit a declared parameter type (None when it fits)."""
    vt = from_json_value(value)
    if not is_a(vt, want):
        return f"{vt} {json.dumps(value)}" if not isinstance(value, (list, dict)) else str(vt)
    if want_text == "int" and isinstance(value, float) and value != int(value):
        return f"the fraction {value}"
    return None


def _zero(t: T) -> Any:
    return {"number": 0, "bool": False, "string": "", "list": [], "record": {}}.get(t.name)


def schema_type(schema: dict[str, str]) -> T:
    return record({k: list_of(ANY) if v == "list" else TYPE_NAMES.get(v, ANY) for k, v in schema.items()})


def _strings(v: Any) -> set[str]:
    if isinstance(v, str):
        return {v}
    if isinstance(v, list):
        return set().union(*(_strings(x) for x in v)) if v else set()
    if isinstance(v, dict):
        return set().union(*(_strings(x) for x in v.values())) if v else set()
    return set()


def section_field(tag: str) -> str:
    name = "".join(ch for ch in tag.lower() if ch.isalnum() or ch == "_")
    return name or "section"
