"""Evaluates IR expressions (rewards, conditions, routing, metrics) at run time.

The expression language is interpreted here over plain Python values; nothing is ever
passed to Python's eval. Replies are dicts (records); roles evaluate to a RoleView whose
`turns` are the role's replies in this session."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from askspec.ir import model as ir
from askspec.ir.builtins import AGGREGATES, STATEFUL, pairs, spec_range


class EvalError(Exception):
    """A run-time error in a spec expression; carries the IR span for the message."""

    def __init__(self, message: str, span: ir.Span | None = None) -> None:
        where = f"{span.file}:{span.line}:{span.col}: " if span else ""
        super().__init__(where + message)
        self.span = span


class MissingValue(EvalError):
    """A variable with no value on this path (or, in metrics, not defined by this game)."""


@dataclass
class RoleView:
    name: str
    turns: list[dict] = field(default_factory=list)
    model: str = ""

    @property
    def calls(self) -> int:
        return len(self.turns)


@dataclass
class Env:
    vars: dict[str, Any]
    params: dict[str, Any]
    roles: dict[str, RoleView] = field(default_factory=dict)
    stateful: Callable[[str, str, list, dict], Any] | None = None  # (fn, site, args, kwargs) -> value
    item: dict | None = None
    collections: dict[str, list] = field(default_factory=dict)  # data sets and buffers by name
    rewards: dict[str, float] | None = None  # metrics: the session's total reward per role
    seed: int | None = None  # the session's seed (`draw`)

    def child_item(self, item: Any) -> "Env":
        return Env(self.vars, self.params, self.roles, self.stateful, {"it": item, **(item if isinstance(item, dict) else {})},
                   self.collections, self.rewards, self.seed)


def _num(x: Any, span) -> float:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)):
        return x
    if x is None:
        raise EvalError("a number was expected but the value is missing", span)
    try:
        return float(x)
    except (TypeError, ValueError):
        raise EvalError(f"a number was expected, found {type(x).__name__} {str(x)[:40]!r}", span) from None


def _list(x: Any, span) -> list:
    if isinstance(x, list):
        return x
    raise EvalError(f"a list was expected, found {type(x).__name__}", span)


def evaluate(e: ir.Expr, env: Env) -> Any:
    return _EVAL[e.__class__](e, env)


def _lit(e: ir.Lit, env: Env) -> Any:
    return e.value


def _ref(e: ir.Ref, env: Env) -> Any:
    scope = e.scope
    if scope == "item" and env.item is not None:
        return env.item.get(e.name)
    if scope == "role":
        view = env.roles.get(e.name)
        if view is None:
            raise EvalError(f"role '{e.name}' is not part of this session", e.span)
        return view
    if scope == "param":
        return env.params[e.name]
    if scope in ("data", "buffer"):
        if e.name in env.collections:
            return env.collections[e.name]
        raise EvalError(f"{scope} '{e.name}' is not loaded", e.span)
    if e.name in env.vars:
        return env.vars[e.name]
    if env.item is not None and e.name in env.item:
        return env.item[e.name]
    if e.name in env.params:
        return env.params[e.name]
    raise MissingValue(f"'{e.name}' has no value yet on this path", e.span)


def _attr(e: ir.GetAttr, env: Env) -> Any:
    return get_field(evaluate(e.obj, env), e.name, e.span)


def _index(e: ir.GetIndex, env: Env) -> Any:
    obj = evaluate(e.obj, env)
    idx = evaluate(e.index, env)
    try:
        if isinstance(obj, list):
            return obj[int(_num(idx, e.span))]
        if isinstance(obj, dict):
            return obj.get(str(idx))
    except IndexError:
        raise EvalError(f"index {idx} is out of range (length {len(obj)})", e.span) from None
    raise EvalError(f"cannot index a {type(obj).__name__}", e.span)


def _unary(e: ir.UnaryOp, env: Env) -> Any:
    v = evaluate(e.operand, env)
    return -_num(v, e.span) if e.op == "-" else not bool(v)


def _case(e: ir.CaseOf, env: Env) -> Any:
    if e.subject is not None:
        subj = evaluate(e.subject, env)
        for arm in e.arms:
            if evaluate(arm.when, env) == subj:
                return evaluate(arm.then, env)
    else:
        for arm in e.arms:
            if evaluate(arm.when, env):
                return evaluate(arm.then, env)
    if e.default is not None:
        return evaluate(e.default, env)
    raise EvalError("no case arm matched and there is no else", e.span)


def _list_of(e: ir.ListOf, env: Env) -> list:
    return [evaluate(x, env) for x in e.items]


def _record_of(e: ir.RecordOf, env: Env) -> dict:
    return {name: evaluate(v, env) for name, v in e.fields.items()}


def _filter(e: ir.Filter, env: Env) -> list:
    seq = _list(evaluate(e.seq, env), e.span)
    return [x for x in seq if evaluate(e.cond, env.child_item(x))]


def get_field(obj: Any, name: str, span) -> Any:
    if isinstance(obj, RoleView):
        if name == "turns":
            return obj.turns
        if name == "calls":
            return obj.calls
        if name == "model":
            return obj.model
    if isinstance(obj, dict):
        if name in obj:
            return obj[name]
        return None  # optional data fields / parser fields not found are missing values
    if isinstance(obj, list):
        return [get_field(x, name, span) for x in obj]
    if obj is None:
        raise EvalError(f"cannot read '{name}' of a missing value", span)
    raise EvalError(f"a {type(obj).__name__} has no field '{name}'", span)


def _binary(e: ir.BinaryOp, env: Env) -> Any:
    op = e.op
    if op == "and":
        return bool(evaluate(e.left, env)) and bool(evaluate(e.right, env))
    if op == "or":
        return bool(evaluate(e.left, env)) or bool(evaluate(e.right, env))
    l = evaluate(e.left, env)
    r = evaluate(e.right, env)
    if op == "==":
        return _eq(l, r)
    if op == "!=":
        return not _eq(l, r)
    if op == "+" and isinstance(l, str) and isinstance(r, str):
        return l + r
    if op in ("<", "<=", ">", ">="):
        if isinstance(l, str) and isinstance(r, str):  # strings order as text, anything else as numbers
            return {"<": l < r, "<=": l <= r, ">": l > r, ">=": l >= r}[op]
        x, y = _num(l, e.span), _num(r, e.span)
        return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]
    a, b = _num(l, e.span), _num(r, e.span)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            raise EvalError("division by zero", e.span)
        return a / b
    if op == "%":
        if b == 0:
            raise EvalError("modulo by zero", e.span)
        return a % b
    raise EvalError(f"unknown operator {op}", e.span)


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    return a == b


def _nums(xs: list, span) -> list[float]:
    return [_num(x, span) for x in xs]


def aggregate(fn: str, xs: list, span: ir.Span | None = None) -> Any:
    """An aggregate built-in over values (missing ones skipped, except by count/all/any)."""
    if fn == "count":
        return len(xs)
    if fn in ("all", "any"):
        return (all if fn == "all" else any)(bool(x) for x in xs)
    vals = _nums([x for x in xs if x is not None], span)
    if fn == "sum":
        return float(sum(vals))
    if not vals:
        return float("nan") if fn in ("mean", "rate", "var", "std") else None
    if fn in ("mean", "rate"):
        return sum(vals) / len(vals)
    if fn == "var":
        return statistics.pvariance(vals)
    if fn == "std":
        return math.sqrt(statistics.pvariance(vals))
    if fn == "min":
        return min(vals)
    if fn == "max":
        return max(vals)
    raise EvalError(f"unknown aggregate {fn}", span)


def _aggregate(e: ir.CallFn, env: Env) -> Any:
    args = [evaluate(a, env) for a in e.args]
    if e.fn in ("min", "max") and len(args) > 1:
        vals = _nums(args, e.span)
        return min(vals) if e.fn == "min" else max(vals)
    return aggregate(e.fn, _list(args[0], e.span), e.span)


def _stateful(e: ir.CallFn, env: Env) -> Any:
    if env.stateful is None:
        raise EvalError(f"'{e.fn}' is not available here", e.span)
    args = [evaluate(a, env) for a in e.args]
    kwargs = {k: evaluate(v, env) for k, v in e.kwargs.items()}
    return env.stateful(e.fn, e.site, args, kwargs)


def _reward(e: ir.CallFn, env: Env) -> float:
    """metrics: a session's total reward for a role (0 outside a metric's session scope)."""
    view = evaluate(e.args[0], env) if e.args else None
    totals = env.rewards or {}
    return float(totals.get(view.name if isinstance(view, RoleView) else str(view), 0.0))


def _draw(e: ir.CallFn, env: Env) -> list:
    """`draw(xs, n)`: n elements of xs drawn at random without replacement (all of xs,
    shuffled, when it has fewer), seeded by the session's seed and the call's place in
    the spec: each session draws afresh (SOAR's reward questions, soar.txt §3.2), and a
    replayed session draws the same."""
    import random

    xs = evaluate(e.args[0], env)
    n = evaluate(e.args[1], env)
    if not isinstance(xs, list):
        raise EvalError(f"draw() needs a list, found {type(xs).__name__}", e.span)
    k = max(0, min(int(_num(n, e.span)), len(xs)))
    where = f"{e.span.line}:{e.span.col}" if e.span is not None else ""
    return random.Random(f"askspec-draw:{env.seed}:{where}").sample(xs, k)


def _pure(fn: str, impl: Callable[..., Any]) -> Callable[[ir.CallFn, Env], Any]:
    def call(e: ir.CallFn, env: Env) -> Any:
        args = [evaluate(a, env) for a in e.args]
        try:
            return impl(*args)
        except EvalError:
            raise
        except Exception as err:
            raise EvalError(f"{fn}(): {err}", e.span) from None

    return call


def _call(e: ir.CallFn, env: Env) -> Any:
    impl = _CALLS.get(e.fn)
    if impl is None:
        raise EvalError(f"unknown function '{e.fn}'", e.span)
    return impl(e, env)


def _equiv(a: Any, b: Any) -> bool:
    from askspec.runtime.replies.verify import equiv

    return bool(equiv(a, b))


def _words(text: Any, n: Any) -> str:
    from askspec.runtime.replies.parsers import words

    return words("" if text is None else str(text), int(n))


def _boxed(text: Any) -> str:
    from askspec.runtime.replies.parsers import last_boxed

    return last_boxed("" if text is None else str(text)) or ""


def _jaccard(a: Any, b: Any) -> float:
    from askspec.runtime.scoring.diversity import jaccard

    return float(jaccard(str(a or ""), str(b or "")))


def _product(*lists: list) -> list:
    import itertools

    return [list(t) for t in itertools.product(*lists)]


def _range(a: Any, b: Any = None) -> list:
    return list(spec_range(a, b))  # one definition, shared with the planner


def _num_fn(x: Any) -> float:
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(str(x).strip())
    except ValueError:
        return float("nan")


_PURE: dict[str, Callable[..., Any]] = {
    "len": lambda x: len(x) if x is not None else 0,
    "clip": lambda x, lo, hi: max(lo, min(hi, x)),
    "abs": lambda x: abs(x),
    "round": lambda x, n=0: round(x, int(n)),
    "equiv": _equiv,
    "jaccard": _jaccard,
    "words": _words,
    "boxed": _boxed,
    "lower": lambda s: str(s or "").lower(),
    "upper": lambda s: str(s or "").upper(),
    "strip": lambda s: str(s or "").strip(),
    "contains": lambda s, x: (x in s) if s is not None else False,
    "exists": lambda x: x is not None and x != "",
    "pairs": pairs,
    "product": _product,
    "range": _range,
    "str": lambda x: "" if x is None else str(x),
    "num": _num_fn,
}

# one entry per run-time function of the built-in table (askspec/ir/builtins.py)
_CALLS: dict[str, Callable[[ir.CallFn, Env], Any]] = {
    **{name: _pure(name, impl) for name, impl in _PURE.items()},
    **{name: _aggregate for name in AGGREGATES},
    **{name: _stateful for name in STATEFUL},
    "reward": _reward,
    "draw": _draw,
}

_EVAL: dict[type, Callable[[Any, Env], Any]] = {
    ir.Lit: _lit, ir.Ref: _ref, ir.GetAttr: _attr, ir.GetIndex: _index, ir.CallFn: _call, ir.UnaryOp: _unary,
    ir.BinaryOp: _binary, ir.CaseOf: _case, ir.ListOf: _list_of, ir.RecordOf: _record_of, ir.Filter: _filter,
}
