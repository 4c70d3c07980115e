"""Numbers are finite: an out-of-range literal or an overflowing constant is E006 at its
span (never `null` in the IR, never an internal error), and a `--set` value out of range
is E111 with the reason."""

from __future__ import annotations

import math

import pytest

from askspec.ir import canonical
from askspec.lang.compiler import compile_source

from lang_helpers import run_cli

BASE = 'model m = hf("smollm2-135m-instruct")\nrole q { model = m; prompt = "hi" }\n'


def errors(src: str, overrides: dict[str, str] | None = None) -> list[tuple[str, str, int, int]]:
    res = compile_source("t.ask", src, overrides)
    assert not any(d.code == "E999" for d in res.sink.items), [d.message for d in res.sink.items]
    return [(d.code, d.message, d.span.line if d.span else 0, d.span.col if d.span else 0)
            for d in res.sink.sorted() if d.is_error and d.code != "E114"]  # E114: a fragment without a game


@pytest.mark.parametrize("src, line, col", [
    ("param x = 1e400\n", 1, 11),
    ("param x: int = 1e400\n", 1, 16),
    ("param x = -1e400\n", 1, 12),
    ("param x = [1, 2e308]\n", 1, 15),
    ("param x = {a: 1E+309}\n", 1, 15),
    ("param x = " + "9" * 310 + "\n", 1, 11),
    ("param x = " + "9" * 5000 + "\n", 1, 11),  # past Python's int() digit limit
    ('model m2 = hf("x") { temperature = 1e400 }\n', 1, 36),
    ('model m2 = hf("x", max_tokens = 1e400)\n', 1, 33),
    ("game g { repeat 1e400 { ask q } }\n", 3, 17),
    ("data d = [{score: 1e400}]\n", 1, 19),
    ("metric mm = 1e400\n", 1, 13),
    ("game g { x = 1e400 }\n", 3, 14),
])
def test_out_of_range_literal_is_e006_at_the_literal(src, line, col):
    if "ask q" in src or "game" in src:
        src = BASE + src
        line = line
    found = errors(src)
    assert found and found[0][0] == "E006", found
    assert (found[0][2], found[0][3]) == (line, col)
    assert "out of range" in found[0][1]


@pytest.mark.parametrize("src, what", [
    ("param x = 1e308 * 10\n", "the default of parameter 'x'"),
    ("param a = 1e300\nparam x = a * a\n", "the default of parameter 'x'"),
    ("param x = -1e308 - 1e308\n", "the default of parameter 'x'"),
    ("param x = 1e308 / 1e-308\n", "the default of parameter 'x'"),
    ("param x = " + "9" * 300 + " * " + "9" * 300 + "\n", "the default of parameter 'x'"),
    ("param x = " + "9" * 300 + " / 1e-300\n", "the default of parameter 'x'"),
    ('model m2 = hf("x") { temperature = 1e308 + 1e308 }\n', "sampling field 'temperature'"),
])
def test_overflowing_constant_is_e006(src, what):
    found = errors(src)
    assert found and found[0][0] == "E006" and found[0][1].startswith(what), found


@pytest.mark.parametrize("stmt", ["repeat 1e308 * 10 { ask q }", "x = sample 1e308 * 10 ask q",
                                  "for i in [1] limit 1e308 * 10 { ask q }"])
def test_overflowing_bounds_are_e006(stmt):
    found = errors(BASE + "game g {\n    " + stmt + "\n}\n")
    assert [c for c, *_ in found] == ["E006"], found


@pytest.mark.parametrize("value", ["1e400", "-1e400", "1e308*10", "[1e400]", "{a: 1e400}", "9" * 5000,
                                   "1e308/1e-308"])
@pytest.mark.parametrize("decl", ["param n: int = 3", "param n = 1.0", "param n = [1.0]", "param n: any = 1"])
def test_override_out_of_range_is_e111(decl, value):
    found = errors(decl + "\n", {"n": value})
    assert [c for c, *_ in found] == ["E111"], found
    assert "out of range" in found[0][1] and len(found[0][1]) < 200


def test_large_but_finite_numbers_compile():
    res = compile_source("t.ask", "param x = 1e308\nparam y = 123456789012345678901234567890\nparam z = 1e-400\n"
                         + BASE + "game g { ask q }\n")
    assert res.ok
    values = {p.name: p.value for p in res.ir.params}
    assert values["x"] == 1e308 and values["y"] == 123456789012345678901234567890 and values["z"] == 0.0
    import json

    dumped = {p["name"]: p["value"] for p in json.loads(canonical.to_json(res.ir))["params"]}
    assert dumped == values
    assert all(math.isfinite(v) for v in values.values())


def test_pairs_of_a_huge_constant_list_is_refused():
    found = errors("param p = pairs([" + ", ".join(map(str, range(2000))) + "])\n")
    assert [c for c, *_ in found] == ["E005"] and "pairs of 2000 items" in found[0][1]


@pytest.mark.parametrize("args", [
    ["check", "{spec}", "--set", "n=1e400"],
    ["compile", "{spec}", "--set", "n=1e400"],
    ["compile", "{spec}", "--set", "f=1e400", "--format", "hash"],
    ["check", "{bad}"],
    ["compile", "{bad}"],
])
def test_cli_reports_without_internal_error(tmp_path, args):
    spec = tmp_path / "s.ask"
    spec.write_text("param n: int = 3\nparam f = 1.0\n")
    bad = tmp_path / "bad.ask"
    bad.write_text("param y: int = 1e400\nparam x = 1e400\n")
    proc = run_cli(*[a.format(spec=spec, bad=bad) for a in args], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "internal" not in proc.stderr and "Traceback" not in proc.stderr
    assert "E006" in proc.stderr or "E111" in proc.stderr
