"""Compile-time evaluation of constant expressions (parameter defaults, loop bounds,
model settings, --set values)."""

from __future__ import annotations

from typing import Any

from ..ir.builtins import pairs
from ..ir.plansize import ARITHMETIC
from . import ast as A

# Stands for a template or model reference that was already reported as invalid, so later
# checks do not report it as missing. Only ever appears in IR that has errors (discarded).
INVALID = "!invalid"


# Bounds on what constant evaluation may build: numbers stay finite floats (or ints in
# float range, which also keeps int arithmetic cheap), and `pairs` of a long list is
# refused rather than grown quadratically.
MAX_NUMBER = 1.7976931348623157e308
MAX_CONST_ITEMS = 1_000_000


class NotConstant(Exception):
    def __init__(self, node: A.Node, why: str = "not a constant") -> None:
        super().__init__(why)
        self.node = node
        self.why = why


class OutOfRange(NotConstant):
    """A constant expression whose value is not a finite number (E006)."""


class TooLarge(NotConstant):
    """A constant expression that would build too large a value (E005)."""


def _number(e: A.Node, v: int | float) -> int | float:
    if v != v or abs(v) > MAX_NUMBER:  # NaN, inf, or an int past the float range
        raise OutOfRange(e, "the result is out of range (not a finite number)")
    return v


def const_eval(e: A.Expr, params: dict[str, Any]) -> Any:
    if isinstance(e, (A.Number, A.String, A.Bool)):
        return e.value
    if isinstance(e, A.Name):
        if e.id in params:
            return params[e.id]
        raise NotConstant(e, f"'{e.id}' is not a parameter or constant")
    if isinstance(e, A.ListLit):
        return [const_eval(x, params) for x in e.items]
    if isinstance(e, A.RecordLit):
        return {k: const_eval(v, params) for k, v in e.fields}
    if isinstance(e, A.Unary) and e.op == "-":
        v = const_eval(e.operand, params)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return _number(e, -v)
        raise NotConstant(e, "'-' needs a number")
    if isinstance(e, A.Binary) and e.op in ARITHMETIC:
        l, r = const_eval(e.left, params), const_eval(e.right, params)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (l, r)):
            if e.op == "/" and r == 0:
                raise NotConstant(e, "division by zero")
            try:
                return _number(e, ARITHMETIC[e.op](l, r))
            except OverflowError:  # int / int whose quotient is past the float range
                raise OutOfRange(e, "the result is out of range (not a finite number)") from None
        raise NotConstant(e, f"'{e.op}' needs numbers")
    if isinstance(e, A.Call) and e.func == "len" and len(e.args) == 1:
        v = const_eval(e.args[0], params)
        if isinstance(v, (list, str)):
            return len(v)
    if isinstance(e, A.Call) and e.func == "pairs" and len(e.args) == 1:
        v = const_eval(e.args[0], params)
        if isinstance(v, list):
            if len(v) * (len(v) - 1) // 2 > MAX_CONST_ITEMS:
                raise TooLarge(e, f"pairs of {len(v)} items would be more than {MAX_CONST_ITEMS:,} pairs")
            return pairs(v)
    raise NotConstant(e)


def parse_override(text: str) -> A.Expr | None:
    """Parse a --set value as a constant expression; None when it is not one (a bare
    word is then taken as a string). A number out of range raises OutOfRange."""
    from ..diagnostics import DiagnosticSink
    from .parser import parse

    sink = DiagnosticSink()
    module = parse("<--set>", f"metric __v = {text}", sink)
    bad = next((d for d in sink.items if d.code == "E006"), None)
    if bad is not None and bad.span is not None:
        raise OutOfRange(A.Name(bad.span, text), bad.message)
    if module is None or sink.has_errors or len(module.decls) != 1:
        return None
    decl = module.decls[0]
    return decl.value if isinstance(decl, A.MetricDecl) else None
