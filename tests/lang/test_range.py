"""`range(n)` is 0..n-1 and `range(a, b)` is a..b-1 (half-open, as in Python and
docs/language.md); `repeat i in a..b` is the inclusive form."""

from __future__ import annotations

from pathlib import Path

import pytest

from askspec.lang.compiler import compile_source
from askspec.runtime.engine.plan import plan_sessions

SPEC = '''model m = hf("smollm2-135m-instruct")
role q { model = m; prompt = "{{ x }}" }
game g for x in RANGE {
    ask q
}
'''


@pytest.mark.parametrize("expr, values", [
    ("range(3)", [0, 1, 2]),
    ("range(1, 4)", [1, 2, 3]),
    ("range(2, 3)", [2]),
    ("range(3, 3)", []),
    ("range(0)", []),
])
def test_game_over_a_range_plans_half_open(expr, values):
    res = compile_source("t.ask", SPEC.replace("RANGE", expr))
    assert res.ok, [d.message for d in res.sink.items]
    plans = plan_sessions(res.ir, res.ir.param_values(), {}, seed=0)
    assert [p.bindings["x"] for p in plans] == values


def test_docs_say_the_same():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text()
    assert "| `range` | `(n)` or `(a, b) -> list[number]` | `0..n-1` / `a..b-1` (half-open" in doc
