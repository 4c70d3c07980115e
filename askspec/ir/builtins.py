"""The built-in functions of the expression language, in one table.

The checker (`askspec/lang/exprs.py`) types every call from this table and the runtime
evaluator (`askspec/runtime/engine/evaluator.py`) dispatches on it: a function is added
here once, with its signature, and then implemented in the evaluator (a test checks that
the evaluator implements exactly the table's run-time functions).

Argument kinds (what a checker accepts; the phrase is what an error says is needed):

    number     a number                               "numbers"
    text       a string or a number                   "text"
    string     a string                               "text"
    scalar     a string, number or bool               "text"
    sized      a list or a string                     "a list or string"
    seq        a string or a list                     "text or a list"
    list       a list                                 "a list"
    lists      a list (in a function taking several)  "lists"
    items      a list; in a metric, any session value "a list"
    numbers    a list of numbers or bools; in a metric, a number per session
    bools      a list of bools; in a metric, a bool per session
    role       a role                                 "a role"
    words      a number of words                      "a number of words"
    path       a string literal (resolved by the compiler)
    value      anything

Return kinds: number, bool, string, template, list[number], `list[elem]` (a list of the
first argument's element type: `draw`) and `list[list[elem]]` (lists of the element type
of the list arguments: `pairs`, `product`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Builtin:
    name: str
    params: tuple[str, ...]  # argument kinds; the last one repeats up to max_args
    returns: str
    min_args: int
    max_args: int
    keywords: tuple[str, ...] = ()  # numeric keyword options
    aggregate: bool = False  # in a metric, lifts over sessions: the argument is evaluated per session
    stateful: bool = False  # depends on the texts earlier sessions passed at the same call site
    spread: str | None = None  # with 2+ arguments, each is of this kind (`min(a, b, c)`)
    context: Literal["any", "metric", "compile"] = "any"  # compile: resolved before run time

    def kind_of(self, i: int, n_args: int) -> str:
        """The kind of argument i of a call with n_args arguments."""
        if self.spread is not None and n_args > 1:
            return self.spread
        return self.params[min(i, len(self.params) - 1)]


def _b(name: str, params: tuple[str, ...], returns: str, lo: int | None = None, hi: int | None = None,
       **kw) -> Builtin:
    n = len(params)
    return Builtin(name, params, returns, n if lo is None else lo, n if hi is None else hi, **kw)


_TABLE = [
    *(_b(n, ("numbers",), "number", aggregate=True) for n in ("mean", "var", "std", "sum", "rate")),
    _b("count", ("items",), "number", aggregate=True),
    *(_b(n, ("numbers",), "number", 1, 8, aggregate=True, spread="number") for n in ("min", "max")),
    *(_b(n, ("bools",), "bool", aggregate=True) for n in ("all", "any")),
    _b("len", ("sized",), "number"),
    _b("clip", ("number", "number", "number"), "number"),
    _b("abs", ("number",), "number"),
    _b("round", ("number", "number"), "number", 1, 2),
    _b("equiv", ("text", "text"), "bool"),
    _b("jaccard", ("text", "text"), "number"),
    _b("words", ("string", "words"), "string"),
    *(_b(n, ("text",), "string") for n in ("boxed", "lower", "upper", "strip", "str")),
    _b("num", ("scalar",), "number"),
    _b("contains", ("seq", "value"), "bool"),
    _b("exists", ("value",), "bool"),
    _b("pairs", ("list",), "list[list[elem]]"),
    _b("product", ("lists",), "list[list[elem]]", 2, 4),
    _b("range", ("number", "number"), "list[number]", 1, 2),
    _b("draw", ("list", "number"), "list[elem]"),
    _b("file", ("path",), "template", context="compile"),
    _b("reward", ("role",), "number", context="metric"),
    _b("diversity", ("string",), "number", keywords=("k", "window", "alpha"), stateful=True),
    _b("novelty", ("string",), "number", keywords=("history", "tau_sim"), stateful=True),
]

BUILTINS: dict[str, Builtin] = {b.name: b for b in _TABLE}
AGGREGATES = frozenset(b.name for b in _TABLE if b.aggregate)
STATEFUL = frozenset(b.name for b in _TABLE if b.stateful)
# what the evaluator runs: everything but the functions the compiler resolves
RUNTIME = frozenset(b.name for b in _TABLE if b.context != "compile")


def spec_range(a: Any, b: Any = None) -> range:
    """The spec language's `range`: `range(n)` is 0..n-1 and `range(a, b)` is a..b-1,
    half-open as in Python. The evaluator lists it; the planner iterates and counts it
    without listing (askspec.ir.plansize)."""
    if b is None:
        return range(int(a))
    return range(int(a), int(b))


def pairs(xs: list) -> list[list]:
    """Unordered pairs in order: pairs([a, b, c]) = [[a, b], [a, c], [b, c]] (the checker's
    constant folding and the evaluator share it)."""
    return [[xs[i], xs[j]] for i in range(len(xs)) for j in range(i + 1, len(xs))]
