"""Models and roles: backends and sampling settings, derived models, role settings,
memory, reply parsers and recovery: a compiler pass over the shared check context
(checker_base.py's CheckContext: the state and helpers every pass reads)."""

from __future__ import annotations

from typing import Any, cast

from ..ir import model as ir
from ..ir.vocab import (BACKENDS, Backend, JSON_RETRIES, PARSERS, SAMPLING_FIELDS, SUMMARY_KEEP, SUMMARY_MAX_CHARS, SUMMARY_TAGS,
                        WHOLE_SAMPLING_FIELDS, tag_field)
from . import ast as A
from .checker_base import CheckContext
from .consts import INVALID
from .exprs import irspan, suggest
from .paths import FileRefused, resolve_spec_path
from ..span import Span
from .templates import CONFINED_HINT
from .types import ANY, BOOL, NUM, STR, T, from_json_value, list_of, reply_type

MODEL_OPTION_KEYS = {"base_url", "api_key_env", "concurrency", "timeout", "retries", "max_batch", "file", "prefix_cache",
                     "quantize", "max_response_bytes"}
QUANTIZE = ("none", "int8", "fp16")  # hf: reduced-precision weights in the linear layers (opt-in; runtime hf_quant)
ROLE_KEYS = {"model", "memory", "system", "prompt", "reply", "require", "recover", "recover_truncated",
             "recover_malformed", "retries", "max_tokens", "max_prompt_tokens", "prompt_overflow", *SAMPLING_FIELDS}
PROMPT_OVERFLOW_HINT = ("prompt_overflow = truncate_left (cut the start of the new message) or prompt_overflow = "
                        "end(OUTCOME) (end the session with that outcome)")


def lower_sampling(exp: ir.Experiment) -> ir.Experiment:
    """Each role's `resolved_sampling`: its fields on its declared model (ir.merged_sampling),
    once the models, roles and sampling defaults are known."""
    for r in exp.roles:
        m = exp.model(r.model) if r.model else None
        r.resolved_sampling = ir.merged_sampling(exp.sampling_defaults, m.sampling if m is not None else {}, r)
    return exp


class RoleChecks:
    """The models and roles pass (compiler.py runs it after the parameters and templates)."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx

    def models(self, decls: list[A.ModelDecl]) -> None:
        by_name = {d.name: d for d in decls}
        done: dict[str, ir.Model] = {}
        visiting: set[str] = set()

        def build(d: A.ModelDecl) -> ir.Model | None:
            if d.name in done:
                return done[d.name]
            if d.name in visiting:
                self.ctx.err("E107", f"model '{d.name}' derives from itself", d.base.span)
                return None
            visiting.add(d.name)
            base = d.base
            if isinstance(base, A.Name):
                parent_decl = by_name.get(base.id)
                if parent_decl is None:
                    self.ctx.err("E103", f"unknown model '{base.id}'", base.span, suggest(base.id, by_name))
                    return None
                self.ctx.used.add(("model", base.id))
                parent = build(parent_decl)
                if parent is None:
                    return None
                m = parent.model_copy(deep=True, update={"name": d.name, "derived_from": base.id, "span": irspan(d.span)})
            elif isinstance(base, A.Call) and base.func == "current":
                current = self.current_weights_model(d, base, by_name, build)
                if current is None:
                    visiting.discard(d.name)
                    return None
                m = current
            elif isinstance(base, A.Call) and base.func in BACKENDS:
                weights = ""
                if base.args:
                    w = self.ctx.const(base.args[0], "model weights")
                    if not isinstance(w, str):
                        self.ctx.err("E107", "model weights must be a string", base.args[0].span)
                    else:
                        weights = w
                if len(base.args) > 1:
                    self.ctx.err("E109", f"{base.func}() takes the weights and keyword options", base.span)
                if base.func in ("python", "replay") and not weights:
                    need = 'callable "module:function"' if base.func == "python" else "replay file path"
                    self.ctx.err("E107", f"{base.func}() needs a {need}", base.span)
                if base.func == "python" and weights and ":" not in weights:
                    self.ctx.err("E107", "a python model names its callable as \"package.module:function\"", base.args[0].span)
                # (base.func is one of BACKENDS, the names of the IR's Backend literal)
                m = ir.Model(span=irspan(d.span), name=d.name, backend=cast(Backend, base.func), weights=weights)
                for k, v in base.kwargs:
                    self.model_attr(m, k, v, base.span)
            else:
                what = base.func if isinstance(base, A.Call) else type(base).__name__.lower()
                self.ctx.err("E107", f"a model is a backend call such as hf(\"weights\") or another model's name, not {what}",
                             base.span, f"backends: {', '.join(sorted(BACKENDS))}")
                return None
            for a in d.attrs:
                self.model_attr(m, a.name, a.value, a.name_span)
            if isinstance(base, A.Call) and base.func == "replay":
                self.replay_paths(m, base, d.attrs)
            visiting.discard(d.name)
            done[d.name] = m
            return m

        for d in decls:
            m = build(d)
            if m is not None and all(x.name != m.name for x in self.ctx.exp.models):
                self.ctx.exp.models.append(m)
        self.ctx.exp.models.sort(key=lambda m: [d.name for d in decls].index(m.name))

    def current_weights_model(self, d: A.ModelDecl, base: A.Call, by_name: dict, build) -> ir.Model | None:
        """`model key = current(questioner) { temperature = 0.0 }`: the trained role's
        current weights, with the role's model's settings overridden by this body."""
        if len(base.args) != 1 or base.kwargs or not isinstance(base.args[0], A.Name):
            self.ctx.err("E109", "current(...) takes one role name: current(questioner)", base.span)
            return None
        arg = base.args[0]
        role_decl = self.ctx.role_decls.get(arg.id)
        if role_decl is None:
            self.ctx.err("E102", f"unknown role '{arg.id}'", arg.span, suggest(arg.id, self.ctx.role_decls))
            return None
        self.ctx.used.add(("role", arg.id))
        if not any(f.name == "trained" for f in role_decl.flags):
            self.ctx.err("E405", f"current({arg.id}) serves the weights a trainer updates, but role '{arg.id}' is not "
                         f"marked 'trained'", arg.span, f"use the role's model directly, or mark it: role {arg.id} {{ trained }}")
            return None
        model_attr = next((a for a in role_decl.attrs if a.name == "model"), None)
        if model_attr is None or not isinstance(model_attr.value, A.Name) or model_attr.value.id not in by_name:
            self.ctx.err("E403", f"current({arg.id}): role '{arg.id}' has no declared model of its own", arg.span,
                         f"give it one: role {arg.id} {{ model = ... }}")
            return None
        parent_name = model_attr.value.id
        if parent_name == d.name:
            self.ctx.err("E107", f"model '{d.name}' is role '{arg.id}''s own model; current({arg.id}) must be another model",
                         base.span)
            return None
        parent = build(by_name[parent_name])
        if parent is None:
            return None
        if parent.backend != "hf":
            self.ctx.err("E405", f"current({arg.id}): the local trainer trains hf models, and role '{arg.id}' runs on "
                         f"{parent.backend}", arg.span)
            return None
        return parent.model_copy(deep=True, update={"name": d.name, "derived_from": parent_name, "weights_of": arg.id,
                                                    "span": irspan(d.span)})

    def sampling_value(self, key: str, value: A.Expr) -> Any:
        """A sampling field's constant value (models and roles), or None if invalid."""
        v = self.ctx.const(value, f"sampling field '{key}'")
        if v is None:
            return None
        if key == "stop":
            v = [v] if isinstance(v, str) else v
            if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
                self.ctx.err("E107", "stop must be a string or a list of strings", value.span)
                return None
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            self.ctx.err("E201", f"'{key}' must be a number, found {from_json_value(v)}", value.span)
            return None
        elif (v < 0 and key != "presence_penalty") or (key in WHOLE_SAMPLING_FIELDS and v != int(v)):
            whole = "whole " if key in WHOLE_SAMPLING_FIELDS else ""
            self.ctx.err("E107", f"'{key}' must be a {whole}number ≥ 0, found {v}", value.span)
            return None
        elif (key == "top_p" and not 0 < v <= 1) or (key == "min_p" and v > 1):
            # probabilities: the hf sampler would take top_p > 1 as off and drop every token
            # for min_p > 1 (no token is min_p times as likely as the likeliest); vLLM refuses both
            low = "0 <" if key == "top_p" else "0 ≤"
            self.ctx.err("E107", f"'{key}' must be a probability, {low} {key} ≤ 1, found {v}", value.span,
                         "top_p = 1 keeps every token" if key == "top_p" else "min_p = 0 keeps every token")
            return None
        return v

    def model_attr(self, m: ir.Model, key: str, value: A.Expr, span: Span) -> None:
        if key in SAMPLING_FIELDS:
            v = self.sampling_value(key, value)
            if v is not None:
                m.sampling[key] = v
        elif key == "quantize":
            v = self.ctx.const(value, "model setting 'quantize'")
            if v is None:
                return
            if v not in QUANTIZE:
                self.ctx.err("E107", f"quantize must be one of {', '.join(repr(q) for q in QUANTIZE)}, found "
                             f"{from_json_value(v) if not isinstance(v, str) else repr(v)}", value.span)
            elif m.backend != "hf" and v != "none":
                self.ctx.err("E107", f"quantize applies to hf models, and model '{m.name}' runs on {m.backend}", value.span)
            else:
                m.options[key] = v
        elif key in MODEL_OPTION_KEYS:
            v = self.ctx.const(value, f"model setting '{key}'")
            m.options[key] = v
        else:
            self.ctx.err("E105", f"unknown model setting '{key}'", span, suggest(key, {*SAMPLING_FIELDS, *MODEL_OPTION_KEYS}))

    def replay_paths(self, m: ir.Model, base: A.Call, attrs: list[A.Attribute]) -> None:
        """E304: a recording a spec names (`replay("answers.json")`, `file = "..."`) lies
        in the spec's folder, like its templates and data: its replies become turns that
        other roles, and so their endpoints, are sent."""
        named = [(m.weights, base.args[0].span)] if base.args else []
        file = m.options.get("file")
        spans = [v.span for k, v in base.kwargs if k == "file"] + [a.value.span for a in attrs if a.name == "file"]
        if isinstance(file, str) and spans:
            named.append((file, spans[-1]))
        for path, span in named:
            if not path:
                continue
            try:
                resolve_spec_path(self.ctx.spec_dir, path)
            except FileRefused as e:
                self.ctx.err("E304", f"replay file refused: {e}", span, CONFINED_HINT)

    def warn_quantized_trained(self) -> None:
        """W504: `quantize` on the model of a trained role (or a current(role) model). Those
        weights are the trainer's: a training run serves them in full precision (the
        trainer's policy takes no quantize option); only an --eval-only run quantises them."""
        for r in self.ctx.exp.roles:
            if not r.trained or not isinstance(r.model, str):
                continue
            for m in self.ctx.exp.models:
                if (m.name == r.model or m.weights_of == r.name) and m.options.get("quantize", "none") != "none":
                    span = self.ctx.decl_spans.get(("model", m.name))
                    self.ctx.sink.warn("W504", f"model '{m.name}' sets quantize = \"{m.options['quantize']}\" but serves "
                                       f"the weights of trained role '{r.name}': training keeps them in full precision, "
                                       f"so quantize applies only to --eval-only runs", span)

    # -- roles
    def role(self, d: A.RoleDecl) -> None:
        attrs = {}
        for a in d.attrs:
            if a.name in attrs:
                self.ctx.err("E104", f"role setting '{a.name}' given twice", a.name_span)
            attrs[a.name] = a
            if a.name not in ROLE_KEYS:
                self.ctx.err("E105", f"unknown role setting '{a.name}'", a.name_span, suggest(a.name, ROLE_KEYS))
        trained = False
        for f in d.flags:
            if f.name == "trained":
                trained = True
            elif f.name != "frozen":
                self.ctx.err("E105", f"unknown role flag '{f.name}'", f.span, suggest(f.name, ["trained", "frozen"]) or "flags: trained, frozen")
        for name, span in d.names:
            if any(r.name == name for r in self.ctx.exp.roles):
                continue
            r = ir.Role(span=irspan(d.span), name=name, trained=trained)
            if "model" in attrs:
                mv = attrs["model"].value
                if isinstance(mv, A.Name) and self.ctx.exp.model(mv.id) is not None:
                    r.model = mv.id
                    self.ctx.used.add(("model", mv.id))
                elif isinstance(mv, A.Name) and mv.id in ("bound", "per_session"):
                    r.model = None
                elif isinstance(mv, A.Name) and ("model", mv.id) in self.ctx.decl_spans:
                    self.ctx.used.add(("model", mv.id))  # declared, but broken: reported at its declaration
                    r.model = INVALID
                elif isinstance(mv, A.Name):
                    self.ctx.err("E103", f"unknown model '{mv.id}'", mv.span, suggest(mv.id, lambda: [m.name for m in self.ctx.exp.models]))
                    r.model = INVALID
                else:
                    self.ctx.err("E107", "a role's model is the name of a declared model", mv.span)
                    r.model = INVALID
            if "memory" in attrs:
                r.memory = self.memory(attrs["memory"].value)
            for key in ("system", "prompt"):
                if key in attrs:
                    setattr(r, key, self.ctx.template(attrs[key].value))
            if "reply" in attrs:
                r.reply = self.reply_parser(attrs["reply"].value)
            if "require" in attrs:
                req = self.ctx.const(attrs["require"].value, "require")
                req = [req] if isinstance(req, str) else req
                if not isinstance(req, list) or not all(isinstance(x, str) for x in req):
                    self.ctx.err("E107", "require is a field name or a list of them", attrs["require"].value.span)
                else:
                    for x in req:
                        if x not in r.reply.fields:
                            self.ctx.err("E202", f"require: the reply parser has no field '{x}'", attrs["require"].value.span,
                                         f"fields: {', '.join(r.reply.fields) or 'none (use sections(...), summary(...), boxed or json(...))'}")
                    r.reply.required = req
            rec = r.recover
            if "recover" in attrs:
                rv = attrs["recover"].value
                if isinstance(rv, A.Name) and rv.id == "resample":
                    rec.mode = "resample"  # rejection sampling: discard and sample again
                else:
                    rec.truncated = rec.malformed = self.ctx.template(rv)
                rec.retries = 1
            if rec.mode == "resample":
                for key in ("recover_truncated", "recover_malformed"):
                    if key in attrs:
                        self.ctx.err("E107", f"'{key}' has no use with 'recover = resample'", attrs[key].name_span)
            if "recover_truncated" in attrs:
                rec.truncated = self.ctx.template(attrs["recover_truncated"].value)
                rec.retries = max(rec.retries, 1)
            if "recover_malformed" in attrs:
                rec.malformed = self.ctx.template(attrs["recover_malformed"].value)
                rec.retries = max(rec.retries, 1)
            if "retries" in attrs:
                n = self.ctx.const_int(attrs["retries"].value, "retries")
                if n is not None:
                    rec.retries = n
            if "max_tokens" in attrs:
                r.max_tokens = self.ctx.const_int(attrs["max_tokens"].value, "max_tokens", 1)
            for key in SAMPLING_FIELDS:
                if key in attrs and key != "max_tokens":  # a role's own setting, checked above
                    v = self.sampling_value(key, attrs[key].value)
                    if v is not None:
                        r.sampling[key] = v
            self.prompt_cap(r, attrs, d)
            self.ctx.exp.roles.append(r)

    def prompt_cap(self, r: ir.Role, attrs: dict[str, A.Attribute], d: A.RoleDecl) -> None:
        """`max_prompt_tokens = N` with `prompt_overflow = truncate_left | end(OUTCOME)`:
        the two come together, so a spec always says what a longer prompt becomes."""
        cap, over = attrs.get("max_prompt_tokens"), attrs.get("prompt_overflow")
        if cap is not None:
            r.max_prompt_tokens = self.ctx.const_int(cap.value, "max_prompt_tokens", 1)
            if over is None:
                self.ctx.err("E106", f"role '{r.name}' sets max_prompt_tokens but not what a longer prompt becomes",
                             cap.name_span, PROMPT_OVERFLOW_HINT)
        if over is None:
            return
        if cap is None:
            self.ctx.err("E107", "'prompt_overflow' has no use without 'max_prompt_tokens'", over.name_span,
                         f"cap the prompt: role {r.name} {{ max_prompt_tokens = 2048; prompt_overflow = ... }}")
            return
        e = over.value
        if isinstance(e, A.Name) and e.id == "truncate_left":
            r.prompt_overflow = ir.PromptOverflow(mode="truncate_left")
        elif isinstance(e, A.Call) and e.func == "end" and len(e.args) == 1 and not e.kwargs \
                and isinstance(e.args[0], A.Name):
            r.prompt_overflow = ir.PromptOverflow(mode="end", outcome=e.args[0].id)
        else:
            self.ctx.err("E107", "prompt_overflow is truncate_left or end(OUTCOME), an outcome every game asking "
                         f"'{r.name}' declares", e.span, PROMPT_OVERFLOW_HINT)

    def memory(self, e: A.Expr) -> ir.Memory:
        if isinstance(e, A.Name):
            match e.id:
                case "full" | "none":
                    return ir.Memory(kind=e.id)
        if isinstance(e, A.Call) and e.func == "window" and len(e.args) == 1:
            n = self.ctx.const_int(e.args[0], "window size", 1)
            return ir.Memory(kind="window", size=n or 1)
        if isinstance(e, A.Call) and e.func == "shared" and len(e.args) == 1 and isinstance(e.args[0], A.Name) \
                and not e.kwargs:
            self.ctx.conversation_spans.setdefault(e.args[0].id, e.args[0].span)
            return ir.Memory(kind="shared", conversation=e.args[0].id)
        self.ctx.err("E107", "memory is full, none, window(N) or shared(CONVERSATION)", e.span)
        return ir.Memory()

    def check_conversations(self) -> None:
        """A shared conversation is named by two roles or more: one named once is a typo
        (or a role that wants `memory = full`)."""
        for name, span in self.ctx.conversation_spans.items():
            sharing = [r.name for r in self.ctx.exp.roles if r.memory.conversation == name]
            if len(sharing) != 1:
                continue
            others = [n for n in self.ctx.conversation_spans if n != name]
            self.ctx.err("E107", f"no other role shares conversation '{name}' with '{sharing[0]}'", span,
                         suggest(name, others) or "a conversation is shared by the roles whose memory is "
                         f"shared({name}); for one role's own conversation use memory = full")

    def reply_parser(self, e: A.Expr) -> ir.ReplyParser:
        name = e.id if isinstance(e, A.Name) else e.func if isinstance(e, A.Call) else None
        args = e.args if isinstance(e, A.Call) else []
        kwargs = dict(e.kwargs) if isinstance(e, A.Call) else {}
        if name == "text":
            return ir.ReplyParser(kind="text")
        if name == "boxed":
            return ir.ReplyParser(kind="boxed", fields=list(PARSERS["boxed"].fields), required=list(PARSERS["boxed"].required))
        if name == "sections":
            tags = [self.ctx.const(a, "a section tag") for a in args]
            if not tags or not all(isinstance(t, str) and tag_field(t) for t in tags):
                self.ctx.err("E109", "sections() takes one or more tag strings, each with a letter or digit to name its field, "
                             "e.g. sections(\"#Draft#\", \"#Question#\")", e.span)
                return ir.ReplyParser(kind="text")
            fields = [tag_field(t) for t in tags]
            return ir.ReplyParser(kind="sections", args={"tags": tags}, fields=fields, required=[fields[-1]])
        if name == "summary":
            after = kwargs.get("after")
            given = self.ctx.const(after, "summary tags") if after is not None else None
            tags = list(SUMMARY_TAGS) if given is None else [given] if isinstance(given, str) else given
            if not isinstance(tags, list) or not tags or not all(isinstance(t, str) and t for t in tags):
                self.ctx.err("E107", "after is a tag string or a list of them", after.span if after is not None else e.span)
                tags = list(SUMMARY_TAGS)
            max_chars = SUMMARY_MAX_CHARS
            if "max_chars" in kwargs:
                max_chars = self.ctx.const_int(kwargs["max_chars"], "max_chars", 1) or SUMMARY_MAX_CHARS
            keep = SUMMARY_KEEP[0]
            if "keep" in kwargs:
                kv = kwargs["keep"]
                keep = kv.id if isinstance(kv, A.Name) else ""
                if keep not in SUMMARY_KEEP:
                    self.ctx.err("E107", "keep is boxed (the last \\boxed{} answer always survives the cut) or none", kv.span)
                    keep = SUMMARY_KEEP[0]
            options = PARSERS["summary"].args
            for k in kwargs:
                if k not in options:
                    self.ctx.err("E109", f"summary() has no option '{k}'", e.span, f"options: {', '.join(options)}")
            return ir.ReplyParser(kind="summary", args={"after": tags, "max_chars": max_chars, "keep": keep},
                                  fields=list(PARSERS["summary"].fields))
        if name == "tags":
            tags = [self.ctx.const(a, "a tag name") for a in args]
            if not tags or not all(isinstance(t, str) and t and t.replace("_", "").replace("-", "").isalnum() for t in tags):
                self.ctx.err("E109", "tags() takes one or more tag names, e.g. tags(\"question\", \"answer\")", e.span)
                return ir.ReplyParser(kind="text")
            for k in kwargs:
                if k != "boxed":
                    self.ctx.err("E109", f"tags() has no option '{k}'", e.span, "options: boxed")
            fields = [tag_field(t) for t in tags]
            targs: dict = {"tags": tags}
            if "boxed" in kwargs:
                b = self.ctx.const(kwargs["boxed"], "boxed")
                if b not in tags:
                    self.ctx.err("E107", "boxed names one of the tags, whose last \\boxed{} becomes the field 'answer'", kwargs["boxed"].span)
                else:
                    targs["boxed"] = b
                    if "answer" not in fields:
                        fields.append("answer")
            return ir.ReplyParser(kind="tags", args=targs, fields=fields, required=list(fields))
        if name == "json":
            if len(args) != 1 or not isinstance(args[0], A.RecordLit):
                self.ctx.err("E109", "json() takes a schema record, e.g. json({is_correct: bool, notes: string})", e.span)
                return ir.ReplyParser(kind="text")
            schema = {}
            for k, v in args[0].fields:
                tname = v.id if isinstance(v, A.Name) else v.value if isinstance(v, A.String) else None
                if tname not in ("bool", "number", "string", "list", "any"):
                    self.ctx.err("E107", f"json schema field '{k}' must be bool, number, string, list or any", v.span)
                    tname = "any"
                schema[k] = tname
            retries = (self.ctx.const_int(kwargs["retries"], "retries") or 0) if "retries" in kwargs else JSON_RETRIES
            return ir.ReplyParser(kind="json", args={"schema": schema, "retries": retries}, fields=list(schema), required=list(schema))
        self.ctx.err("E107", "reply is text, boxed, sections(...), tags(...), summary(...) or json({...})", e.span)
        return ir.ReplyParser(kind="text")

    def reply_types(self) -> dict[str, T]:
        out = {}
        for r in self.ctx.exp.roles:
            fields: dict[str, T] = {}
            if r.reply.kind == "json":
                m = {"bool": BOOL, "number": NUM, "string": STR, "list": list_of(ANY), "any": ANY}
                fields = {k: m[v] for k, v in r.reply.args["schema"].items()}
            else:
                fields = {f: STR for f in r.reply.fields}
            out[r.name] = reply_type(fields, r.name)
        return out
