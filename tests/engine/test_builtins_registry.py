"""One table of built-in functions (askspec/ir/builtins.py) serves the checker and the
evaluator: every run-time function is implemented, nothing else is, and the checker types
each call from the same row."""

from __future__ import annotations

import pytest

from askspec.ir import builtins
from askspec.lang.compiler import compile_source
from askspec.runtime.engine import evaluator, stateful


def test_the_evaluator_implements_exactly_the_run_time_functions():
    assert set(evaluator._CALLS) == set(builtins.RUNTIME)


def test_aggregates_and_stateful_functions_come_from_the_table():
    assert evaluator.AGGREGATES is builtins.AGGREGATES
    assert stateful.STATEFUL is builtins.STATEFUL
    assert builtins.STATEFUL == {"diversity", "novelty"}
    assert "file" not in builtins.RUNTIME and "reward" in builtins.RUNTIME


def _diagnostics(expr: str) -> list[str]:
    src = f"""
model m = python("fake_models:always_one")
role a {{ model = m; memory = none; prompt = "q" }}
game g {{
    r = ask a
    x = {expr}
}}
"""
    res = compile_source("t.ask", src, {})
    return [f"{d.code} {d.message}" for d in res.sink.items]


@pytest.mark.parametrize("expr, expected", [
    ("clip(1, 2)", "E109 'clip' takes 3 arguments, got 2"),
    ("words(r.text)", "E109 'words' takes 2 arguments, got 1"),
    ("len(1)", "E201 'len' needs a list or string, found number"),
    ("max(1, \"a\")", "E201 'max' needs numbers, found string"),
    ("mean([\"a\"])", "E201 'mean' needs a list of numbers or bools, found list[string]"),
    ("novelty(r.text, k = 3)", "E109 'novelty' has no keyword argument 'k'"),
    ("diversity(r.text, k = \"x\")", "E201 'diversity' option 'k' must be a number, found string"),
    ("product([1], 2)", "E201 'product' needs lists, found number"),
    ("mean2([1])", "E108 unknown function 'mean2'"),
])
def test_the_checker_types_calls_from_the_table(expr, expected):
    assert expected in _diagnostics(expr)


@pytest.mark.parametrize("expr", ["min([1, 2])", "min(1, 2, 3)", "pairs([1, 2])", "round(1.5)", "num(true)",
                                  "contains([1], 1)", "novelty(r.text, history = 5)", "boxed(r.text)"])
def test_well_typed_calls_pass(expr):
    assert _diagnostics(expr) == []
