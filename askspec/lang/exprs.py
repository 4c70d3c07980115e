"""Type-checks expressions and lowers them to IR expressions in one walk.

Names resolve through a chain of scopes (loop and session variables, parameters, roles);
outcomes declared by the game resolve as enum literals. Errors are reported to the sink
and the walk goes on with type `any`, so one run reports every independent error."""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import heapq
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from ..ir import model as ir
from ..ir.builtins import BUILTINS as FUNCTIONS, Builtin
from . import ast as A
from ..diagnostics import DiagnosticSink
from ..span import Span
from .types import ANY, BOOL, NUM, OUTCOME, STR, TEMPLATE, T, boolish, is_a, list_of, numeric, record, unify


def irspan(s: Span | None) -> ir.Span | None:
    if s is None:
        return None
    return ir.Span(file=s.file, line=s.line, col=s.col, end_line=s.end_line, end_col=s.end_col)


@dataclass
class Sym:
    kind: str  # param | var | role | item | data
    type: T
    span: Span | None
    used: bool = False


@dataclass
class Scope:
    parent: "Scope | None" = None
    names: dict[str, Sym] = field(default_factory=dict)

    def lookup(self, name: str) -> Sym | None:
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return s.names[name]
            s = s.parent
        return None

    def kind_of(self, name: str) -> str | None:
        """The kind of the symbol `name` names, or None when it is not defined."""
        sym = self.lookup(name)
        return sym.kind if sym is not None else None

    def define(self, name: str, sym: Sym) -> None:
        self.names[name] = sym

    def all_names(self) -> set[str]:
        out: set[str] = set()
        s: Scope | None = self
        while s is not None:
            out |= set(s.names)
            s = s.parent
        return out

    def child(self) -> "Scope":
        return Scope(self)


# "did you mean" compares a misspelled name with every name it could have been: with N
# names and N misspellings that is N² comparisons (20,000 undefined names against 20,000
# parameters took minutes). So suggestions share a budget of names looked at per compile;
# once it is spent, diagnostics come without suggestions and checking stays linear.
SUGGEST_WORK = 200_000
_SUGGEST_LEFT: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("askspec_suggest_left", default=None)


@contextlib.contextmanager
def suggestion_budget(work: int = SUGGEST_WORK) -> Iterator[None]:
    """Give the suggestions made inside the block ``work`` names to look at, in total."""
    token = _SUGGEST_LEFT.set([work])
    try:
        yield
    finally:
        _SUGGEST_LEFT.reset(token)


def _spend(n: int) -> bool:
    left = _SUGGEST_LEFT.get()
    if left is None:
        return True
    if left[0] <= 0:
        return False
    left[0] -= max(n, 1)
    return True


def suggest(name: str, candidates: Iterable[str] | Callable[[], Iterable[str]]) -> str | None:
    """A "did you mean" hint, or None. Pass a callable when the candidates cost something
    to gather (a scope's names): it is not called once the budget is spent."""
    if not _spend(0):
        return None
    names = sorted(candidates() if callable(candidates) else candidates)
    if not _spend(len(names)):
        return None
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.7)
    return f"did you mean '{close[0]}'?" if close else None


def name_list(names: Callable[[], Iterable[str]], n: int = 12) -> str | None:
    """The first ``n`` names in order, comma-separated, within the same budget (None past it)."""
    if not _spend(0):
        return None
    gathered = list(names())
    if not _spend(len(gathered)):
        return None
    return ", ".join(heapq.nsmallest(n, gathered))


BUILTINS = sorted(FUNCTIONS)  # names, for "did you mean" and the docs test


class ExprChecker:
    def __init__(self, sink: DiagnosticSink, outcomes: set[str] | None = None, metric: bool = False) -> None:
        self.sink = sink
        self.outcomes = outcomes or set()
        self.metric = metric  # aggregates lift over sessions in metric expressions
        self._site = 0
        self.stateful_calls: list[A.Call] = []  # diversity/novelty calls seen (a data filter refuses them)
        self.role_reply: dict[str, T] = {}  # role name -> its reply record type
        # called with each read of a variable (a game's definite-assignment check, E409)
        self.on_var_read: Callable[[str, Sym, Span], None] | None = None

    # -- helpers
    def error(self, code: str, msg: str, span: Span, hint: str | None = None) -> None:
        self.sink.error(code, msg, span, hint)

    def expect(self, t: T, want: T, span: Span, what: str) -> None:
        if not is_a(t, want):
            self.error("E201", f"{what} must be {want}, found {t}", span)

    # -- main entry
    def check(self, e: A.Expr, scope: Scope) -> tuple[ir.Expr, T]:
        return self.EXPR_CHECKS[type(e)](self, e, scope)

    def _Number(self, e: A.Number, scope):
        return ir.Lit(span=irspan(e.span), value=e.value, type="number"), NUM

    def _String(self, e: A.String, scope):
        return ir.Lit(span=irspan(e.span), value=e.value, type="string"), STR

    def _Bool(self, e: A.Bool, scope):
        return ir.Lit(span=irspan(e.span), value=e.value, type="bool"), BOOL

    def _Name(self, e: A.Name, scope: Scope):
        sym = scope.lookup(e.id)
        if sym is not None:
            sym.used = True
            match sym.kind:
                case "param" | "role" | "item" | "data" | "buffer":
                    return ir.Ref(span=irspan(e.span), name=e.id, scope=sym.kind), sym.type
            if self.on_var_read is not None:
                self.on_var_read(e.id, sym, e.span)
            return ir.Ref(span=irspan(e.span), name=e.id, scope="var"), sym.type
        if e.id in self.outcomes:
            return ir.Lit(span=irspan(e.span), value=e.id, type="outcome"), OUTCOME
        self.error("E101", f"undefined name '{e.id}'", e.span, suggest(e.id, lambda: scope.all_names() | self.outcomes))
        return ir.Lit(span=irspan(e.span), value=None, type="any"), ANY

    def _ListLit(self, e: A.ListLit, scope):
        items, elem = [], ANY
        for i, it in enumerate(e.items):
            x, t = self.check(it, scope)
            items.append(x)
            elem = t if i == 0 else unify(elem, t)
        return ir.ListOf(span=irspan(e.span), items=items), list_of(elem)

    def _RecordLit(self, e: A.RecordLit, scope):
        fields, types = {}, {}
        for k, v in e.fields:
            if k in fields:
                self.error("E104", f"field '{k}' given twice", v.span)
            fields[k], types[k] = self.check(v, scope)
        return ir.RecordOf(span=irspan(e.span), fields=fields), record(types)

    def _Attr(self, e: A.Attr, scope):
        obj, t = self.check(e.obj, scope)
        node = ir.GetAttr(span=irspan(e.span), obj=obj, name=e.name)
        return node, self.attr_type(t, e.name, e.span)

    def attr_type(self, t: T, name: str, span: Span) -> T:
        if t.name == "any":
            return ANY
        if t.name == "role":
            views = {"turns": self.role_reply.get(t.role or "", ANY), "calls": NUM, "model": STR}
            if name == "turns":
                return list_of(views["turns"])
            if name in views:
                return views[name]
            self.error("E202", f"a role has no field '{name}'", span, "roles have 'turns', 'calls' and 'model'")
            return ANY
        if t.name == "list":
            elem = t.elem or ANY
            if elem.name in ("record", "any"):
                return list_of(self.attr_type(elem, name, span))
        if t.name == "record":
            ft = t.field(name)
            if ft is None:
                names = [k for k, _ in (t.fields or ())]
                if t.role:
                    self.error("E202", f"a reply of '{t.role}' has no field '{name}'", span,
                               suggest(name, names) or f"fields: {', '.join(names)}")
                else:
                    self.error("E202", f"no field '{name}' in {t}", span, suggest(name, names))
                return ANY
            return ft
        self.error("E202", f"a {t} value has no fields", span)
        return ANY

    def _Index(self, e: A.Index, scope):
        obj, t = self.check(e.obj, scope)
        idx, it = self.check(e.index, scope)
        node = ir.GetIndex(span=irspan(e.span), obj=obj, index=idx)
        if t.name == "list":
            self.expect(it, NUM, e.index.span, "a list index")
            return node, t.elem or ANY
        if t.name in ("record", "any"):
            return node, ANY
        self.error("E201", f"cannot index a {t} value", e.span)
        return node, ANY

    def _Unary(self, e: A.Unary, scope):
        x, t = self.check(e.operand, scope)
        node = ir.UnaryOp(span=irspan(e.span), op="-" if e.op == "-" else "not", operand=x)  # the grammar's only two
        if e.op == "-":
            if not numeric(t):
                self.error("E201", f"'-' needs a number, found {t}", e.operand.span)
            return node, NUM
        if not boolish(t):
            self.error("E201", f"'not' needs a bool, found {t}", e.operand.span)
        return node, BOOL

    def _Binary(self, e: A.Binary, scope):
        l, lt = self.check(e.left, scope)
        r, rt = self.check(e.right, scope)
        node = ir.BinaryOp(span=irspan(e.span), op=e.op, left=l, right=r)
        op = e.op
        if op in ("and", "or"):
            for side, t in ((e.left, lt), (e.right, rt)):
                if not boolish(t):
                    self.error("E201", f"'{op}' needs bools, found {t}", side.span)
            return node, BOOL
        if op in ("==", "!="):
            scalar = {"number", "string", "bool", "outcome"}
            if lt.name in scalar and rt.name in scalar and lt.name != rt.name:
                self.error("E201", f"cannot compare {lt} with {rt}", e.span)
            return node, BOOL
        if op in ("<", "<=", ">", ">="):
            ok = (numeric(lt) and numeric(rt)) or (lt.name in ("string", "any") and rt.name in ("string", "any"))
            if not ok:
                self.error("E201", f"cannot order {lt} and {rt} with '{op}'", e.span)
            return node, BOOL
        if op == "+" and lt.name == "string" and rt.name in ("string", "any"):
            return node, STR
        for side, t in ((e.left, lt), (e.right, rt)):
            if not numeric(t):
                self.error("E201", f"'{op}' needs numbers, found {t}", side.span)
        return node, NUM

    def _Case(self, e: A.Case, scope):
        arms = []
        result: T | None = None
        subj = None
        st = None
        if e.subject is not None:
            subj, st = self.check(e.subject, scope)
        for cond, value in e.arms:
            if st is not None and st.name == "outcome" and isinstance(cond, A.Name):
                if cond.id not in self.outcomes:
                    self.error("E203", f"unknown outcome '{cond.id}'", cond.span,
                               suggest(cond.id, self.outcomes) or f"declared outcomes: {', '.join(sorted(self.outcomes)) or 'none'}")
                c: ir.Expr = ir.Lit(span=irspan(cond.span), value=cond.id, type="outcome")
            else:
                c, ct = self.check(cond, scope)
                if st is None and not boolish(ct):
                    self.error("E201", f"a case condition must be bool, found {ct}", cond.span)
            v, vt = self.check(value, scope)
            result = vt if result is None else self._merge_arm(result, vt, value.span)
            arms.append(ir.CaseArm(when=c, then=v))
        default = None
        if e.default is not None:
            default, dt = self.check(e.default, scope)
            result = dt if result is None else self._merge_arm(result, dt, e.default.span)
        node = ir.CaseOf(span=irspan(e.span), subject=subj, arms=arms, default=default)
        return node, result or ANY

    def _merge_arm(self, a: T, b: T, span: Span) -> T:
        scalar = {"number", "string", "bool", "outcome"}
        if a.name in scalar and b.name in scalar and a.name != b.name:
            self.error("E201", f"case arms have different types: {a} and {b}", span)
            return ANY
        return unify(a, b)

    def _Where(self, e: A.Where, scope):
        seq, st = self.check(e.seq, scope)
        if self.metric and st.name not in ("list", "any", "record", "role"):
            # in a metric, `x where cond` keeps the sessions in which cond holds
            cond, ct = self.check(e.cond, scope)
            if not boolish(ct):
                self.error("E201", f"a 'where' condition must be bool, found {ct}", e.cond.span)
            return ir.Filter(span=irspan(e.span), seq=seq, cond=cond), st
        if st.name not in ("list", "any"):
            self.error("E201", f"'where' filters a list, found {st}", e.seq.span)
        elem = (st.elem or ANY) if st.name == "list" else ANY
        inner = scope.child()
        inner.define("it", Sym("item", elem, None, used=True))
        if elem.name == "record" and elem.fields is not None:
            for k, v in elem.fields:
                inner.define(k, Sym("item", v, None, used=True))
        cond, ct = self.check(e.cond, inner)
        if not boolish(ct):
            self.error("E201", f"a 'where' condition must be bool, found {ct}", e.cond.span)
        return ir.Filter(span=irspan(e.span), seq=seq, cond=cond), (st if st.name == "list" else list_of(ANY))

    # -- calls
    def _Call(self, e: A.Call, scope):
        args, types = [], []
        for a in e.args:
            x, t = self.check(a, scope)
            args.append(x)
            types.append(t)
        kwargs, ktypes = {}, {}
        for k, v in e.kwargs:
            if k in kwargs:  # the later value would silently win
                self.error("E104", f"keyword argument '{k}' given twice", v.span)
            kwargs[k], ktypes[k] = self.check(v, scope)
        b = FUNCTIONS.get(e.func)
        site = ""
        if b is not None and b.stateful:
            self._site += 1
            site = f"{e.func}#{self._site}"
            self.stateful_calls.append(e)
        node = ir.CallFn(span=irspan(e.span), fn=e.func, args=args, kwargs=kwargs, site=site)
        if b is None:
            self.error("E108", f"unknown function '{e.func}'", e.func_span, suggest(e.func, BUILTINS))
            return node, ANY
        return node, self._signature(b, e, types, ktypes)

    def _signature(self, b: Builtin, e: A.Call, types: list[T], ktypes: dict[str, T]) -> T:
        """Checks a call against its row of the built-in table; returns its result type."""
        n = len(types)
        if not b.min_args <= n <= b.max_args:
            want = str(b.min_args) if b.min_args == b.max_args else f"{b.min_args} to {b.max_args}"
            self.error("E109", f"'{e.func}' takes {want} argument{'s' if b.max_args != 1 else ''}, got {n}", e.span)
        else:
            for i, (a, t) in enumerate(zip(e.args, types)):
                kind = b.kind_of(i, n)
                if kind == "path":
                    if not isinstance(a, A.String):
                        self.error("E107", f"{e.func}() takes a string literal path", a.span)
                    continue
                accepts, needs = _KINDS[kind]
                if not accepts(t, self.metric):
                    self.error("E201", f"'{e.func}' needs {needs}, found {t}", a.span)
        for k, _ in e.kwargs:
            if k not in b.keywords:
                self.error("E109", f"'{e.func}' has no keyword argument '{k}'", e.span,
                           f"keywords: {', '.join(sorted(b.keywords))}" if b.keywords else None)
        for k, t in ktypes.items():
            if k in b.keywords and not numeric(t):
                self.error("E201", f"'{e.func}' option '{k}' must be a number, found {t}", e.span)
        if b.returns == "list[elem]":
            t = types[0] if types else ANY
            return list_of(t.elem if t.name == "list" and t.elem else ANY)
        if b.returns == "list[list[elem]]":
            elem = ANY
            for i, t in enumerate(types):
                te = t.elem if t.name == "list" and t.elem else ANY
                elem = te if i == 0 else unify(elem, te)
            return list_of(list_of(elem))
        return _RETURNS[b.returns]

    # the handler of each node class (one table: a missing handler is a KeyError here, not an attribute lookup)
    EXPR_CHECKS: dict[type, Callable[..., tuple[ir.Expr, T]]] = {
        A.Number: _Number,
        A.String: _String,
        A.Bool: _Bool,
        A.Name: _Name,
        A.ListLit: _ListLit,
        A.RecordLit: _RecordLit,
        A.Attr: _Attr,
        A.Index: _Index,
        A.Unary: _Unary,
        A.Binary: _Binary,
        A.Case: _Case,
        A.Where: _Where,
        A.Call: _Call,
    }


def _list_of_kinds(t: T, elems: tuple[str, ...]) -> bool:
    return t.name == "any" or (t.name == "list" and (t.elem is None or t.elem.name in elems))


# argument kind (askspec/ir/builtins.py) -> (accepts(type, in_metric), what an error says is needed)
_KINDS: dict[str, tuple[Callable[[T, bool], bool], str]] = {
    "number": (lambda t, m: numeric(t), "numbers"),
    "text": (lambda t, m: t.name in ("string", "any", "number"), "text"),
    "string": (lambda t, m: t.name in ("string", "any"), "text"),
    "scalar": (lambda t, m: t.name in ("string", "any", "number", "bool"), "text"),
    "sized": (lambda t, m: t.name in ("list", "string", "any"), "a list or string"),
    "seq": (lambda t, m: t.name in ("string", "list", "any"), "text or a list"),
    "list": (lambda t, m: t.name in ("list", "any"), "a list"),
    "lists": (lambda t, m: t.name in ("list", "any"), "lists"),
    "items": (lambda t, m: m or t.name in ("list", "any"), "a list"),
    # in a metric an aggregate's argument is a session value (lifted over sessions)
    "numbers": (lambda t, m: (m and t.name in ("number", "bool")) or _list_of_kinds(t, ("number", "bool", "any")),
                "a list of numbers or bools"),
    "bools": (lambda t, m: m or _list_of_kinds(t, ("bool", "any")), "a list of bools"),
    "role": (lambda t, m: t.name in ("role", "any"), "a role"),
    "words": (lambda t, m: numeric(t), "a number of words"),
    "value": (lambda t, m: True, "a value"),
}
_RETURNS = {"number": NUM, "bool": BOOL, "string": STR, "template": TEMPLATE, "list[number]": list_of(NUM)}
