"""Checking stays linear in the size of the spec and the number of diagnostics, and the
printed diagnostics are capped (first 100, errors first, then a count of the rest).

The shape is asserted by counting work (function calls, names compared), never by
timing: doubling the input must not much more than double the work. The calls are counted
in a fresh interpreter: under a profile hook, a test worker that has run hundreds of other
tests was seen to take over an hour for what takes a second alone (and pytest-timeout's
alarm handler never finished there either), which stalled CI."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.lang import exprs
from askspec.lang.compiler import compile_source
from askspec.diagnostics import MAX_PRINTED, Diagnostic, DiagnosticSink, Sources, format_diagnostic
from askspec.span import Span

from lang_helpers import run_cli


def bad_params(n: int) -> str:
    """n parameters whose default has the wrong type, each also unused: 2n diagnostics
    (and a game, so that the spec has something to run)."""
    return "".join(f'param p{i}: int = "x"\n' for i in range(n)) + GAME


GAME = 'model m = hf("x")\nrole q { model = m; prompt = "hi" }\ngame g { ask q }\n'



def undefined_names(n: int) -> str:
    """n parameters and a game reading n names that are not defined (near misses)."""
    src = "".join(f"param p{i} = {i}\n" for i in range(n))
    src += 'model m = hf("x")\nrole q { model = m; prompt = "hi" }\ngame g {\n    r = ask q\n'
    src += "".join(f"    v{i} = pp{i}\n" for i in range(n))
    return src + "}\n"


def many_asks(n: int) -> str:
    """n parameters and n asks whose template reads a parameter (no errors)."""
    src = "".join(f"param p{i} = {i}\n" for i in range(n))
    src += 'model m = hf("x")\nrole q { model = m; prompt = "hi {{ p1 }}" }\ngame g {\n'
    return src + "".join(f"    r{i} = ask q\n" for i in range(n)) + "}\n"


def calls(fn) -> int:
    """Python-level function calls made by fn() (a deterministic measure of work)."""
    count = 0

    def prof(frame, event, arg):
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def check_and_print(src: str) -> None:
    res = compile_source("t.ask", src)
    res.sink.emit(res.sources, io.StringIO(), limit=0)  # print all: formatting must be linear too


MAKERS = [bad_params, undefined_names, many_asks]


def _count_in_fresh_interpreter() -> dict[str, list[int]]:
    """{maker: [calls at 300, calls at 600]}, counted by this module's own functions in a
    child interpreter (see the module docstring for why not in the test worker)."""
    here = Path(__file__).parent
    code = ("import json, test_many_diagnostics as t\n"
            "print(json.dumps({m.__name__: [t.calls(lambda: t.check_and_print(m(n))) for n in (300, 600)]"
            " for m in t.MAKERS}))")
    path = os.pathsep.join([str(here), str(here.parent)])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def counted() -> dict[str, list[int]]:
    return _count_in_fresh_interpreter()


@pytest.mark.parametrize("make", MAKERS, ids=lambda f: f.__name__)
def test_work_grows_linearly(make, counted):
    small, large = counted[make.__name__]
    assert large / small < 2.4, (small, large)  # quadratic would be ~4


def test_source_lines_are_split_once():
    class CountingText(str):
        splits = 0

        def splitlines(self, *a):
            CountingText.splits += 1
            return super().splitlines(*a)

    text = CountingText("".join(f"line {i}\n" for i in range(500)))
    sources = Sources()
    sources.add("t.ask", text)
    for i in range(1, 501):
        assert sources.line("t.ask", i) == f"line {i - 1}"
    assert CountingText.splits == 1


def test_suggestions_share_a_budget(monkeypatch):
    """"did you mean" compares names within a fixed budget per compile, whatever the
    number of undefined names."""
    looked = []
    real = exprs.difflib.get_close_matches
    monkeypatch.setattr(exprs.difflib, "get_close_matches",
                        lambda name, names, **kw: looked.append(len(names)) or real(name, names, **kw))
    for n in (500, 2000):
        looked.clear()
        res = compile_source("t.ask", undefined_names(n))
        assert sum(d.code == "E101" for d in res.sink.items) == n
        assert sum(looked) <= exprs.SUGGEST_WORK + n  # at most one list past the budget
    # within the budget, suggestions are made as before
    res = compile_source("t.ask", undefined_names(5))
    assert any(d.hint == "did you mean 'p0'?" for d in res.sink.items)


def sink_with(errors: int, warnings: int) -> DiagnosticSink:
    sink = DiagnosticSink()
    for i in range(max(errors, warnings)):
        if i < warnings:
            sink.warn("W501", f"w{i}", Span("t.ask", 2 * i + 1, 1, 2 * i + 1, 2))
        if i < errors:
            sink.error("E101", f"e{i}", Span("t.ask", 2 * i + 2, 1, 2 * i + 2, 2))
    return sink


def test_printed_diagnostics_are_capped_errors_first():
    out = io.StringIO()
    sink_with(300, 200).emit(Sources(), out)
    lines = out.getvalue().splitlines()
    assert len(lines) == MAX_PRINTED + 1
    assert all("error[E101]" in line for line in lines[:MAX_PRINTED])
    assert lines[-1] == "... and 400 more (200 errors, 200 warnings) not shown; --max-diagnostics 0 shows all"


def test_no_summary_when_everything_fits():
    out = io.StringIO()
    sink_with(3, 2).emit(Sources(), out)
    assert len(out.getvalue().splitlines()) == 5 and "more" not in out.getvalue()
    out = io.StringIO()
    sink_with(300, 200).emit(Sources(), out, limit=0)
    assert len(out.getvalue().splitlines()) == 500


def test_cli_cap_and_flag(tmp_path):
    spec = tmp_path / "many.ask"
    spec.write_text(bad_params(150))  # 300 diagnostics, 3 lines each
    proc = run_cli("check", str(spec), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith("... and 200 more (50 errors, 150 warnings) not shown")
    assert proc.stderr.count("error[E201]") == 100
    proc = run_cli("check", str(spec), "--max-diagnostics", "0", cwd=tmp_path)
    assert proc.stderr.count("[E201]") == 150 and "more" not in proc.stderr
    proc = run_cli("compile", str(spec), "--max-diagnostics", "5", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("error[") == 5
    proc = run_cli("check", str(spec), "--max-diagnostics", "-1", cwd=tmp_path)
    assert proc.returncode == 1 and "whole number" in proc.stderr and "Traceback" not in proc.stderr  # usage error


def test_format_diagnostic_is_unchanged_for_one():
    d = Diagnostic("E101", "undefined name 'x'", Span("t.ask", 1, 5, 1, 6))
    sources = Sources()
    sources.add("t.ask", "a = x\n")
    assert format_diagnostic(d, sources) == "t.ask:1:5: error[E101]: undefined name 'x'\n 1 | a = x\n   |     ^"
