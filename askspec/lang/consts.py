"""Compile-time evaluation of constant expressions (parameter defaults, loop bounds,
model settings, --set values)."""

from __future__ import annotations

from typing import Any

from ..ir.builtins import pairs
from . import ast as A

# Stands for a template or model reference that was already reported as invalid, so later
# checks do not report it as missing. Only ever appears in IR that has errors (discarded).
INVALID = "!invalid"


class NotConstant(Exception):
    def __init__(self, node: A.Node, why: str = "not a constant") -> None:
        super().__init__(why)
        self.node = node
        self.why = why


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
            return -v
        raise NotConstant(e, "'-' needs a number")
    if isinstance(e, A.Binary) and e.op in "+-*/":
        l, r = const_eval(e.left, params), const_eval(e.right, params)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (l, r)):
            if e.op == "+":
                return l + r
            if e.op == "-":
                return l - r
            if e.op == "*":
                return l * r
            if r == 0:
                raise NotConstant(e, "division by zero")
            return l / r
        raise NotConstant(e, f"'{e.op}' needs numbers")
    if isinstance(e, A.Call) and e.func == "len" and len(e.args) == 1:
        v = const_eval(e.args[0], params)
        if isinstance(v, (list, str)):
            return len(v)
    if isinstance(e, A.Call) and e.func == "pairs" and len(e.args) == 1:
        v = const_eval(e.args[0], params)
        if isinstance(v, list):
            return pairs(v)
    raise NotConstant(e)


def parse_override(text: str) -> A.Expr | None:
    """Parse a --set value as a constant expression; None when it is not one."""
    from .diagnostics import DiagnosticSink
    from .parser import parse

    sink = DiagnosticSink()
    module = parse("<--set>", f"metric __v = {text}", sink)
    if module is None or sink.has_errors or len(module.decls) != 1:
        return None
    decl = module.decls[0]
    return decl.value if isinstance(decl, A.MetricDecl) else None
