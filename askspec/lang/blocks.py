"""Data sets, buffers, tournaments, judges, schedules, training and metrics: a compiler
pass over the shared check context (checker_base.py), which reads the roles pass's reply
types and the training pass's settings checks through it."""

from __future__ import annotations

import hashlib
from typing import Any

from ..ir import model as ir
from ..ir.vocab import ALGORITHMS
from . import ast as A
from .exprs import ExprChecker, Scope, Sym, irspan, suggest
from .data_override import KNOWLEDGE_FIELDS, read_data_file
from .paths import MAX_DATA_BYTES, MAX_RECORD_BYTES, FileRefused, open_spec_file, record_too_large
from ..span import Span
from .templates import CONFINED_HINT
from .checker_base import CheckContext
from .training import GATE_SETTINGS
from .types import ANY, BOOL, NUM, OPEN_RECORD, STR, T, TYPE_NAMES, boolish, from_json_value, list_of, record

SCHEDULES = {"online", "alternating", "nested"}
NESTED_KEYS = ["outer", "inner", "copies", "inner_steps", "outer_steps", "datasets", "promotion_window",
               "promotion_threshold", "games", "practice", "evaluate", "reward_questions", "extra_inner_steps",
               "outer_reward"]
OUTER_REWARDS = ("grounded", "intrinsic")
EVICTIONS = {"oldest", "none", "solved", "no_peak", "solved_or_no_peak"}


def _kind(t: T) -> str:
    """A type in a sentence: 'a string', 'a record', 'a list of number'."""
    if t.name == "record":
        return "a record"
    if t.name == "list":
        return f"a list of {t.elem or ANY}"
    return f"a {t}"


def _clash(a: T, b: T) -> bool:
    """Whether values of types a and b cannot be items' values of one field (any, an
    empty list's elements, agrees with everything; records agree on their common fields)."""
    if "any" in (a.name, b.name):
        return False
    if a.name != b.name:
        return True
    if a.name == "list":
        return _clash(a.elem or ANY, b.elem or ANY)
    if a.name == "record" and a.fields and b.fields:
        theirs = dict(b.fields)
        return any(_clash(t, theirs[k]) for k, t in a.fields if k in theirs)
    return False


def _fields(names: list[str]) -> str:
    return ("field " if len(names) == 1 else "fields ") + ", ".join(f"'{n}'" for n in names)


class BlockChecks:
    """The data, block, train and metric declarations' pass."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx

    def data(self, d: A.DataDecl) -> None:
        src = d.source
        cond = None
        if isinstance(src, A.Where):  # `jsonl("x.jsonl") where kind == "ask_mind"`
            cond = src.cond
            src = src.seq
        opts = {}
        for a in d.attrs:
            if a.name == "fields":
                continue
            opts[a.name] = self.ctx.const(a.value, f"data setting '{a.name}'")
            if a.name not in ("limit", "shuffle", "seed", "text_field", "split"):
                self.ctx.err("E105", f"unknown data setting '{a.name}'", a.name_span, "settings: limit, shuffle, seed, text_field, split, fields")
        ds = ir.Dataset(span=irspan(d.span), name=d.name, format="list", items=[], options=opts)
        self.ctx.exp.datasets.append(ds)  # even when invalid, so that uses do not report it as undefined
        if isinstance(src, A.ListLit):
            ds.items = self.ctx.const(src, "inline data") or []
            self.inline_rows(src, ds.items)
        elif isinstance(src, A.Call) and src.func in ("jsonl", "parquet", "knowledge") and len(src.args) == 1:
            path = self.ctx.const(src.args[0], "a data path")
            if not isinstance(path, str):
                if path is not None:
                    self.ctx.err("E107", "a data path is a string", src.args[0].span)
                return
            match src.func:
                case "jsonl" | "parquet" | "knowledge":
                    ds.format, ds.path, ds.items = src.func, path, None
            if d.name not in self.ctx.data_files:  # else the user's file is read instead (data_override)
                ds.digest = self.file_digest(path, src.args[0].span, lines=src.func != "parquet")
        elif isinstance(src, A.Where):  # `... where a where b`: the first `where` parsed as part of the source
            self.ctx.err("E107", "a data set takes one `where` filter", src.span,
                         "join the conditions with `and`: where COND1 and COND2")
            return
        else:
            self.ctx.err("E107", "data is jsonl(\"path\"), parquet(\"path\"), knowledge(\"path\") or a list literal", src.span)
            return
        fields = next((a for a in d.attrs if a.name == "fields"), None)
        if fields is not None:
            self.ctx.exp.datasets[-1].options["fields"] = self.field_types(fields.value)
        if d.name in self.ctx.data_files:
            self.data_override(d, ds)
        if cond is not None:
            self.data_filter(ds, cond)

    def data_override(self, d: A.DataDecl, ds: ir.Dataset) -> None:
        """`--data NAME=FILE`: the block reads the user's file instead (E111, at the block,
        for a file that cannot be read or whose records lack a declared field)."""
        given = self.ctx.data_files[d.name]
        declared = ds.options.get("fields")
        if ds.format == "knowledge":
            declared = {**KNOWLEDGE_FIELDS, **(declared or {})}
        f = read_data_file(given, ds.format, declared)
        for problem in f.unreadable:
            self.ctx.err("E111", f"--data {d.name}={given}: {problem}", d.name_span)
        for problem in f.problems:
            self.ctx.err("E111", f"--data {d.name}={given}: {problem}", d.name_span,
                         f"data '{d.name}' declares {', '.join(f'{k}: {v}' for k, v in (declared or {}).items())}; "
                         "scripts/convert_data.py writes the papers' public formats in these fields")
        ds.format, ds.path, ds.digest, ds.items, ds.user_file = f.format, f.path, f.digest, None, True  # type: ignore[assignment]

    def inline_rows(self, src: A.ListLit, items: list[Any]) -> None:
        """E201 for an inline data item that differs from the first: the items are typed
        by the first one (data_item_type), so another item's missing or extra field, or a
        field of another type, would surface only in a session (or never, as a wrong value)."""
        if len(items) != len(src.items) or not items:
            return  # not a constant list: its own error is reported
        first, first_t = items[0], from_json_value(items[0])
        for n, (node, item) in enumerate(zip(src.items[1:], items[1:]), start=2):
            t = from_json_value(item)
            if not isinstance(first, dict) or not isinstance(item, dict):
                if _clash(first_t, t):
                    self.ctx.err("E201", f"inline data item {n} is {_kind(t)}, item 1 is {_kind(first_t)}: every item of "
                                 "a data set has the first one's type", node.span)
                continue
            missing = [k for k in first if k not in item]
            extra = [k for k in item if k not in first]
            if missing or extra:
                what = "; ".join(x for x in (
                    f"it has no {_fields(missing)}" if missing else "",
                    f"it has {_fields(extra)}, which item 1 has not" if extra else "") if x)
                self.ctx.err("E201", f"inline data item {n} has other fields than item 1: {what}", node.span,
                             "give every item the same fields")
                continue
            spans = {k: e.span for k, e in node.fields} if isinstance(node, A.RecordLit) else {}
            for k, v in item.items():
                a, b = from_json_value(first[k]), from_json_value(v)
                if _clash(a, b):
                    self.ctx.err("E201", f"field '{k}' of inline data item {n} is {_kind(b)}, in item 1 {_kind(a)}",
                                 spans.get(k, node.span), "a field has one type in every item of a data set")

    def data_filter(self, ds: ir.Dataset, cond: A.Expr) -> None:
        """A data set's `where` condition: a bool over the record's fields (typed by the
        declared `fields`, or the inline items; any name of an untyped file's records is
        a field), `it` (the record) and the parameters, evaluated when the data is loaded."""
        item = self.data_item_type(ds.name)
        scope = Scope()
        for p, t in self.ctx.param_types.items():
            scope.define(p, Sym("param", t, None, used=True))
        inner = scope.child()
        inner.define("it", Sym("item", item, None, used=True))
        if item.name == "record" and item.fields is not None:
            for k, v in item.fields:
                inner.define(k, Sym("item", v, None, used=True))
        else:  # open records: every other name is a field, found (or not) at load time
            for n in A.names_in(cond) - set(self.ctx.param_types):
                inner.define(n, Sym("item", ANY, None, used=True))
        checker = ExprChecker(self.ctx.sink, set())
        value, t = checker.check(cond, inner)
        if not boolish(t):
            self.ctx.err("E201", f"a data filter must be bool, found {t}", cond.span,
                         "compare a field: where kind == \"ask_mind\"")
            return
        ds.filter = value
        ds.filter_params = {n: self.ctx.params[n] for n in sorted(A.names_in(cond) & set(self.ctx.param_types))
                            if n in self.ctx.params and inner.kind_of(n) == "param"}
        for n in ds.filter_params:
            self.ctx.used.add(("param", n))
        self.no_stateful(checker, "a data filter runs once per record when the data is loaded",
                         "filter on the record's fields")

    def no_stateful(self, checker: ExprChecker, where: str, instead: str) -> None:
        """E404 for each diversity/novelty call `checker` saw: their histories are a game's
        sessions, in session order (runtime/engine/stateful.py), which only a game step has."""
        for call in checker.stateful_calls:
            self.ctx.err("E404", f"{call.func}() compares a text with earlier sessions' at its call site, and {where}, "
                         "outside any session", call.span, f"{instead}; call {call.func}() in a game, into a session variable")

    def file_digest(self, rel: str, span: Span, lines: bool = False) -> str | None:
        """sha256 of a data file (relative to the spec's folder), so that the experiment
        hash changes when the data does; with `lines` (jsonl), a record (line) past
        MAX_RECORD_BYTES is E304, found on the same pass."""
        try:
            h = hashlib.sha256()
            line, size = 1, 0  # the current line and its bytes so far (its newline included, as run time counts)
            with open_spec_file(self.ctx.spec_dir, rel, MAX_DATA_BYTES) as f:
                # a line wholly inside one chunk is at most a chunk long, so never past the limit:
                # only the line that runs across chunk ends is measured (no Python loop per line)
                for chunk in iter(lambda: f.read(MAX_RECORD_BYTES), b""):
                    h.update(chunk)
                    if not lines:
                        continue
                    first = chunk.find(b"\n")
                    size += len(chunk) if first < 0 else first + 1
                    if size > MAX_RECORD_BYTES and first >= 0:
                        self.ctx.err("E304", f"data file refused: {rel}:{line}: {record_too_large(size)}", span)
                        lines = False
                    elif first >= 0:
                        line += chunk.count(b"\n")
                        size = len(chunk) - chunk.rfind(b"\n") - 1
            if lines and size > MAX_RECORD_BYTES:  # the last line, without a newline
                self.ctx.err("E304", f"data file refused: {rel}:{line}: {record_too_large(size)}", span)
            return h.hexdigest()
        except FileRefused as e:
            self.ctx.err("E304", f"data file refused: {e}", span, CONFINED_HINT)
        except FileNotFoundError:
            self.ctx.err("E303", f"data file not found: {rel}", span, "paths are relative to the spec's folder")
        except OSError as e:
            self.ctx.err("E303", f"cannot read data file {rel}: {e.strerror or e}", span)
        return None

    def data_item_type(self, name: str) -> T:
        buf = next((x for x in self.ctx.exp.buffers if x.name == name), None)
        if buf is not None:
            return schema_type(buf.fields) if buf.fields else OPEN_RECORD
        ds = next((x for x in self.ctx.exp.datasets if x.name == name), None)
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
                self.ctx.err("E105", f"unknown {d.kind} setting '{a.name}'", a.name_span, suggest(a.name, allowed) or f"settings: {', '.join(sorted(allowed))}")
            attrs[a.name] = a
        for r in sorted(required - set(attrs)):
            self.ctx.err("E106", f"{d.kind} '{d.name}' needs a '{r}' setting", d.name_span)
        return attrs

    def role_ref(self, e: A.Expr) -> str | None:
        if isinstance(e, A.Name) and any(r.name == e.id for r in self.ctx.exp.roles):
            return e.id
        if isinstance(e, A.Name):
            self.ctx.err("E102", f"unknown role '{e.id}'", e.span, suggest(e.id, lambda: [r.name for r in self.ctx.exp.roles]))
        else:
            self.ctx.err("E107", "expected a role name", e.span)
        return None

    def block_buffer(self, d: A.BlockDecl) -> None:
        a = self._attrs(d, {"capacity", "eviction", "patience", "fields", "score", "best"}, {"capacity"})
        cap = self.ctx.const_int(a["capacity"].value, "capacity", 1) if "capacity" in a else None
        buf = ir.Buffer(span=irspan(d.span), name=d.name, capacity=cap or 1)
        if "eviction" in a:
            v = a["eviction"].value
            ev = v.id if isinstance(v, A.Name) and v.id not in self.ctx.params else self.ctx.const(v, "eviction")
            if ev not in EVICTIONS:
                self.ctx.err("E107", f"eviction is {', '.join(sorted(EVICTIONS))}, found {ev!r}", v.span,
                             suggest(str(ev), EVICTIONS) if isinstance(ev, str) else None)
            else:
                buf.eviction = ev
        if "patience" in a:
            buf.options["patience"] = self.ctx.const_int(a["patience"].value, "patience", 1)
        if "fields" in a:
            buf.fields = self.field_types(a["fields"].value)
        if "score" in a:
            v = a["score"].value
            if isinstance(v, A.Name):
                buf.score = v.id
                self.ctx.buffer_score_spans[d.name] = v.span
            else:
                self.ctx.err("E107", "score names a session variable of the game that replays the buffer", v.span)
        if "best" in a:  # the field an item's best score starts from (PasoDoble: prev_acc = p_i)
            v = a["best"].value
            if not isinstance(v, A.Name) or v.id not in buf.fields:
                self.ctx.err("E101", f"best names a field of buffer '{d.name}'", v.span,
                             (suggest(v.id, list(buf.fields)) if isinstance(v, A.Name) else None)
                             or f"its fields: {', '.join(buf.fields) or '(none: declare fields)'}")
            elif buf.fields[v.id] != "number":
                self.ctx.err("E201", f"best names a number field; '{v.id}' is {buf.fields[v.id]}", v.span)
            else:
                buf.options["best"] = v.id
        if buf.eviction in ("solved", "no_peak", "solved_or_no_peak") and buf.score is None:
            self.ctx.err("E106", f"buffer '{d.name}' needs a 'score' setting for eviction = {buf.eviction}", d.name_span,
                         "name the replaying game's accuracy variable: score = acc")
        self.ctx.exp.buffers.append(buf)

    def field_types(self, e: A.Expr) -> dict[str, str]:
        """A `fields = {name: type, ...}` setting (data sets and buffers)."""
        if not isinstance(e, A.RecordLit):
            self.ctx.err("E107", "fields is a record of field types, e.g. {question: string, answer: string}", e.span)
            return {}
        schema = {}
        for k, v in e.fields:
            tname = v.id if isinstance(v, A.Name) else None
            if tname not in TYPE_NAMES and tname != "list":
                self.ctx.err("E107", f"unknown type for field '{k}'", v.span, "types: number, bool, string, list, any")
                tname = "any"
            schema[k] = tname
        return schema

    def block_tournament(self, d: A.BlockDecl) -> None:
        a = self._attrs(d, {"judge", "prompt", "pairing", "verdict", "gamma", "aggregate", "order", "retries"}, {"judge", "prompt"})
        judge = self.role_ref(a["judge"].value) if "judge" in a else None
        tpl = self.ctx.template(a["prompt"].value) if "prompt" in a else None
        t = ir.Tournament(span=irspan(d.span), name=d.name, judge=judge or "", template=tpl or "")
        if "pairing" in a:
            v = a["pairing"].value
            if isinstance(v, A.Name) and v.id in ("round_robin", "live"):
                t.pairing = "round_robin" if v.id == "round_robin" else "live"
            elif isinstance(v, A.Call) and v.func == "live":
                opp = [x.id for x in v.args if isinstance(x, A.Name)]
                if len(opp) != len(v.args) or not opp or any(o not in ("best", "worst", "median") for o in opp):
                    self.ctx.err("E107", "live(...) takes best, worst and/or median", v.span)
                else:
                    t.pairing, t.live_opponents = "live", opp
            else:
                self.ctx.err("E107", "pairing is round_robin or live(best, worst, median)", v.span)
        if "verdict" in a:
            v = a["verdict"].value
            if isinstance(v, A.Call) and v.func == "boxed" and len(v.args) == 3:
                labels = [self.ctx.const(x, "a verdict label") for x in v.args]
                if all(isinstance(x, str) for x in labels):
                    t.verdicts = labels
            else:
                self.ctx.err("E107", "verdict is boxed(\"A\", \"B\", \"Tie\") (first wins, second wins, tie)", v.span)
        if "gamma" in a:
            g = self.ctx.const(a["gamma"].value, "gamma")
            if not isinstance(g, (int, float)) or isinstance(g, bool) or not 0.5 <= g <= 1:
                self.ctx.err("E107", "gamma is a number between 0.5 and 1", a["gamma"].value.span)
            else:
                t.gamma = float(g)
        if "aggregate" in a:
            v = a["aggregate"].value
            if isinstance(v, A.Name) and v.id in ("win_rate", "bradley_terry"):
                t.aggregate = "win_rate" if v.id == "win_rate" else "bradley_terry"
            else:
                self.ctx.err("E107", "aggregate is win_rate or bradley_terry", v.span)
        if "order" in a:
            v = a["order"].value
            if isinstance(v, A.Name) and v.id in ("random", "both", "fixed"):
                t.order = "random" if v.id == "random" else "both" if v.id == "both" else "fixed"
            else:
                self.ctx.err("E107", "order is random (the paper's debiasing), both (every pair judged in both orders) or fixed", v.span)
        if "retries" in a:
            t.retries = self.ctx.const_int(a["retries"].value, "retries") or 0
        self.ctx.exp.tournaments.append(t)

    def block_judge(self, d: A.BlockDecl) -> None:
        a = self._attrs(d, {"judge", "prompt", "scores", "retries"}, {"judge", "prompt"})
        judge = self.role_ref(a["judge"].value) if "judge" in a else None
        tpl = self.ctx.template(a["prompt"].value) if "prompt" in a else None
        j = ir.PointwiseJudge(span=irspan(d.span), name=d.name, judge=judge or "", template=tpl or "")
        if "scores" in a:
            s = self.ctx.const(a["scores"].value, "scores")
            if not isinstance(s, list) or not s or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in s):
                self.ctx.err("E107", "scores is a list of numbers", a["scores"].value.span)
            else:
                j.scores = [float(x) for x in s]
        if "retries" in a:
            j.retries = self.ctx.const_int(a["retries"].value, "retries") or 0
        self.ctx.exp.judges.append(j)

    def _nested_blocks(self, d: A.BlockDecl, opts: dict) -> None:
        """A nested schedule's outer role, and its inner role when the inner loop runs (the
        grounded outer reward), train with a train block of their own: its steps and sizes."""
        blocks = {t.role for t in self.ctx.exp.training}
        trained = {r.name for r in self.ctx.exp.roles if r.trained}  # (an untrained one is E405 already)
        grounded = opts.get("outer_reward", "grounded") == "grounded"
        spans = {a.name: a.value.span for a in d.attrs}
        for which in ("outer", "inner") if grounded else ("outer",):
            role = opts.get(which)
            if role in trained and role not in blocks:
                self.ctx.err("E405", f"the {which} role '{role}' of a nested schedule has no train block", spans[which],
                             f"add `train {role} with grpo {{ ... }}`")

    def block_schedule(self, d: A.BlockDecl) -> None:
        if d.name not in SCHEDULES:
            self.ctx.err("E405", f"unknown schedule '{d.name}'", d.name_span, suggest(d.name, SCHEDULES) or f"schedules: {', '.join(sorted(SCHEDULES))}")
            return
        opts: dict[str, Any] = {}
        roles = {r.name for r in self.ctx.exp.roles}
        trained = {r.name for r in self.ctx.exp.roles if r.trained}
        for a in d.attrs:
            if a.name in opts:
                self.ctx.err("E104", f"schedule setting '{a.name}' given twice", a.name_span)
            if a.name == "games":
                opts["games"] = self.schedule_games(a.value, d.name)
            elif d.name == "alternating" and a.name == "iterations":
                opts[a.name] = self.ctx.const_int(a.value, a.name, 1)
            elif d.name == "alternating":
                if a.name not in roles:
                    self.ctx.err("E102", f"unknown role '{a.name}' in alternating schedule", a.name_span, suggest(a.name, roles))
                elif a.name not in trained:
                    self.ctx.err("E405", f"role '{a.name}' has a training phase but is not marked 'trained'", a.name_span)
                opts[a.name] = self.ctx.const_int(a.value, f"steps for {a.name}", 1)
            elif d.name == "nested":
                if a.name in ("outer", "inner"):
                    opts[a.name] = self.role_ref(a.value)
                    if opts[a.name] is not None and opts[a.name] not in trained:
                        self.ctx.err("E405", f"the {a.name} role of a nested schedule must be marked 'trained'", a.value.span)
                elif a.name in ("copies", "inner_steps", "outer_steps", "datasets", "promotion_window",
                                "reward_questions"):
                    opts[a.name] = self.ctx.const_int(a.value, a.name, 1)
                elif a.name == "extra_inner_steps":
                    opts[a.name] = self.ctx.const_int(a.value, a.name, 0)
                elif a.name in ("practice", "evaluate"):
                    games = self.schedule_games(a.value, d.name)
                    if isinstance(games, list) and len(games) > 1:
                        self.ctx.err("E107", f"'{a.name}' names one game", a.value.span)
                    opts[a.name] = games[0] if isinstance(games, list) and games else None
                elif a.name == "outer_reward":
                    v = a.value.id if isinstance(a.value, A.Name) and a.value.id not in self.ctx.params else self.ctx.const(a.value, a.name)
                    if v is not None and v not in OUTER_REWARDS:
                        self.ctx.err("E107", f"outer_reward is one of {', '.join(OUTER_REWARDS)}, found {v!r}", a.value.span)
                    opts[a.name] = v
                elif a.name == "promotion_threshold":
                    v = self.ctx.const(a.value, a.name)
                    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                        self.ctx.err("E201", f"promotion_threshold must be a number, found {from_json_value(v)}", a.value.span)
                    opts[a.name] = v
                else:
                    self.ctx.err("E105", f"unknown nested schedule setting '{a.name}'", a.name_span,
                                 suggest(a.name, NESTED_KEYS) or f"settings: {', '.join(NESTED_KEYS)}")
            else:
                if a.name != "steps":
                    self.ctx.err("E105", f"unknown online schedule setting '{a.name}'", a.name_span, "settings: steps, games")
                opts[a.name] = self.ctx.const_int(a.value, a.name, 1)
        if d.name == "nested":
            for need in ("outer", "inner"):
                if need not in opts:
                    self.ctx.err("E106", f"a nested schedule needs '{need}'", d.name_span)
            self._nested_blocks(d, opts)
            if opts.get("outer_reward", "grounded") == "grounded":
                for need in ("practice", "evaluate"):
                    if need not in opts:
                        self.ctx.err("E106", f"a nested schedule with the grounded outer reward needs '{need}' (the game "
                                     f"{'that trains the inner copies' if need == 'practice' else 'that measures their accuracy'})",
                                     d.name_span)
        if d.name == "alternating" and not any(k in roles for k in opts):
            self.ctx.err("E106", "an alternating schedule needs the steps of each phase, e.g. proposer = 10", d.name_span)
        match d.name:  # one of SCHEDULES (checked above), narrowed to the IR's literal type
            case "online" | "alternating" | "nested":
                self.ctx.exp.schedule = ir.Schedule(span=irspan(d.span), kind=d.name, options=opts)

    def schedule_games(self, e: A.Expr, kind: str) -> Any:
        """`games = [g1, g2]` (which games run), or for alternating schedules
        `games = {role: game_or_list, ...}` (which games run in each role's phase)."""
        names = {g.name for g in self.ctx.exp.games}

        def game_list(v: A.Expr) -> list[str]:
            items = v.items if isinstance(v, A.ListLit) else [v]
            if not items:  # would play nothing: a schedule without sessions, an evaluation of no game
                self.ctx.err("E107", "an empty list names no game", v.span, "name the games: games = [practice]")
            out = []
            for x in items:
                if not isinstance(x, A.Name):
                    self.ctx.err("E107", "expected a game name", x.span)
                elif x.id not in names:
                    self.ctx.err("E110", f"unknown game '{x.id}'", x.span, suggest(x.id, names))
                else:
                    out.append(x.id)
            return out

        if kind == "alternating" and isinstance(e, A.RecordLit):
            roles = {r.name for r in self.ctx.exp.roles}
            out = {}
            for k, v in e.fields:
                if k not in roles:
                    self.ctx.err("E102", f"unknown role '{k}'", v.span, suggest(k, roles))
                out[k] = game_list(v)
            return out
        return game_list(e)

    # -- training
    def train(self, d: A.TrainDecl) -> None:
        role = next((r for r in self.ctx.exp.roles if r.name == d.role), None)
        if role is None:
            self.ctx.err("E102", f"unknown role '{d.role}'", d.role_span, suggest(d.role, lambda: [r.name for r in self.ctx.exp.roles]))
            return
        self.ctx.used.add(("role", d.role))
        if not role.trained:
            self.ctx.err("E405", f"role '{d.role}' is trained here but not marked 'trained'", d.role_span, f"add the flag: role {d.role} {{ trained ... }}")
        algo_e = d.algo
        name = algo_e.id if isinstance(algo_e, A.Name) else algo_e.func if isinstance(algo_e, A.Call) else None
        if name not in ALGORITHMS:
            self.ctx.err("E405", f"unknown training algorithm '{name}'", algo_e.span, (suggest(name, ALGORITHMS) if name else None) or f"algorithms: {', '.join(sorted(ALGORITHMS))}")
            return
        args, hyper = self.ctx.training_checks.training_settings(d, name)
        for a in d.attrs:
            if a.name == "replay":
                if not (isinstance(a.value, A.Name) and any(b.name == a.value.id for b in self.ctx.exp.buffers)):
                    self.ctx.err("E110", "replay names a declared buffer", a.value.span)
                else:
                    self.ctx.used.add(("buffer", a.value.id))
                    hyper["replay"] = a.value.id
        self.ctx.written_training[d.role] = {**args, **hyper}  # lowered into the block once the schedule is known
        self.ctx.exp.training.append(ir.Training(span=irspan(d.span), role=d.role, algorithm=name,
                                                 update_when=self.update_gate(d)))

    def update_gate(self, d: A.TrainDecl) -> ir.Expr | None:
        """`update_when = EXPR`: a yes/no over the step's sessions, in metric scope (E407)."""
        from ..ir.builtins import AGGREGATES

        a = next((x for x in d.attrs if x.name in GATE_SETTINGS), None)
        if a is None:
            return None
        scope, checker = self.metric_scope()
        value, t = checker.check(a.value, scope)
        self.no_stateful(checker, "update_when is evaluated over the step's finished sessions",
                         "gate on session variables")
        for n in A.names_in(a.value):
            if n in self.ctx.params:
                self.ctx.used.add(("param", n))
        if t.name not in ("bool", "any"):
            self.ctx.err("E407", f"update_when must be true or false over the step's sessions, found {t}", a.value.span,
                         "e.g. update_when = sum(valid) > 0")
            return None
        if not _calls(a.value, AGGREGATES):
            self.ctx.err("E407", "update_when must aggregate over the step's sessions (sum, mean, count, ...)", a.value.span,
                         "e.g. update_when = count(valid) > 0, not a per-session condition")
            return None
        return value

    # -- metrics
    def metric_scope(self) -> tuple[Scope, ExprChecker]:
        """What a metric (or an update gate) may name: params, roles, outcome, status, game,
        step and the games' session variables; and a checker in metric mode."""
        outcomes = {o for g in self.ctx.exp.games for o in g.outcomes}
        scope = Scope()
        for p, t in self.ctx.param_types.items():
            scope.define(p, Sym("param", t, None, used=True))
        for r in self.ctx.exp.roles:
            scope.define(r.name, Sym("role", T("role", role=r.name), None, used=True))
        scope.define("outcome", Sym("var", T("outcome"), None, used=True))
        scope.define("status", Sym("var", STR, None, used=True))
        scope.define("game", Sym("var", STR, None, used=True))
        scope.define("step", Sym("var", NUM, None, used=True))  # the training step that played the session
        # the session's group as its route left it (runtime/engine/metrics.py): none outside a group
        scope.define("route", Sym("var", STR, None, used=True))
        scope.define("routed", Sym("var", BOOL, None, used=True))
        scope.define("group_judge_calls", Sym("var", NUM, None, used=True))
        scope.define("nonzero_advantage", Sym("var", BOOL, None, used=True))
        scope.define("advantage", Sym("var", NUM, None, used=True))  # the group-normalised reward
        for g in self.ctx.exp.games:
            for name, t in self.ctx.session_vars.get(g.name, {}).items():
                scope.define(name, Sym("var", t, None, used=True))
        checker = ExprChecker(self.ctx.sink, outcomes, metric=True)
        checker.role_reply = self.ctx.role_checks.reply_types()
        return scope, checker

    def metric(self, m: A.MetricDecl) -> None:
        scope, checker = self.metric_scope()
        value, _ = checker.check(m.value, scope)
        self.no_stateful(checker, "a metric is evaluated over the run's finished sessions",
                         "aggregate session variables")
        self.metric_unassigned_reads(m, scope)
        for n in A.names_in(m.value) | {name for name, _ in m.by}:
            if n in self.ctx.params:
                self.ctx.used.add(("param", n))
        by = []
        for name, span in m.by:
            if scope.kind_of(name) in (None, "role"):
                self.ctx.err("E101", f"cannot group by '{name}': not a session variable", span,
                             suggest(name, lambda: [n for n in scope.all_names() if scope.kind_of(n) != "role"]))
            by.append(name)
        self.ctx.exp.metrics.append(ir.Metric(span=irspan(m.span), name=m.name, value=value, by=by))


    def metric_unassigned_reads(self, m: A.MetricDecl, scope: Scope) -> None:
        """E409: the metric reads a session variable that a game setting it may leave
        unassigned at the game's end (the sessions on that path would silently drop out of
        the metric). A game that never sets the variable, and a session that ends early with
        `end`, give the metric nothing by design."""
        seen: set[str] = set()
        for node in _name_nodes(m.value):
            n = node.id
            if n in seen or n in _SESSION_COLUMNS or scope.kind_of(n) != "var":
                continue
            seen.add(n)
            for g in self.ctx.exp.games:
                why = self.ctx.session_unassigned.get(g.name, {}).get(n)
                if why is not None and n in self.ctx.session_vars.get(g.name, {}):
                    self.ctx.err("E409", f"metric '{m.name}' reads '{n}', which game '{g.name}' leaves unassigned {why}",
                                 node.span, f"assign '{n}' on every path of game '{g.name}' (e.g. a default before the "
                                 f"`if`): as it is, the metric leaves out the sessions without it")

    # the handler of each kind (one table: a missing handler is a KeyError here, not an attribute lookup)
    BLOCKS = {
        "buffer": block_buffer,
        "tournament": block_tournament,
        "judge": block_judge,
        "schedule": block_schedule,
    }


# what a metric reads from the session's row, not from its variables (runtime/engine/metrics.py)
_SESSION_COLUMNS = frozenset({"outcome", "status", "game"})


def _name_nodes(e: Any) -> list[A.Name]:
    """The names an expression (or any node) reads, in source order."""
    if isinstance(e, A.Name):
        return [e]
    out: list[A.Name] = []
    for v in getattr(e, "__dict__", {}).values():
        for x in (v if isinstance(v, list) else [v]):
            for y in (x if isinstance(x, tuple) else (x,)):
                if isinstance(y, A.Node):
                    out += _name_nodes(y)
    return out


def schema_type(schema: dict[str, str]) -> T:
    return record({k: list_of(ANY) if v == "list" else TYPE_NAMES.get(v, ANY) for k, v in schema.items()})


def _calls(e: Any, names) -> bool:
    """Whether `e` (an expression, or any node) calls one of `names` anywhere."""
    if isinstance(e, A.Call) and e.func in names:
        return True
    for v in getattr(e, "__dict__", {}).values():
        for x in (v if isinstance(v, list) else [v]):
            for y in (x if isinstance(x, tuple) else (x,)):
                if isinstance(y, A.Node) and _calls(y, names):
                    return True
    return False
