"""What the hardening limits cost: template rendering in the bounded sandbox, and
checking specs with many diagnostics.

    python bench/bench_limits.py [--renders 20000] [--sizes 2500,5000,10000,20000]

1. Render time per template, Jinja2's plain ImmutableSandboxedEnvironment against the
   bounded sandbox of askspec/lang/sandbox.py (same template, same variables, the
   engine's render path), median of 5 batches.
2. `askspec check` on generated specs whose diagnostics grow with N (N parameters with a
   wrong default type, 2N diagnostics; N undefined names next to N parameters; N asks
   over N parameters): wall time of the in-process check, diagnostics formatted (all of
   them, as `--max-diagnostics 0` prints). Linear checking doubles the time with N.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jinja2  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

from askspec.lang.compiler import compile_source  # noqa: E402
from askspec.lang.sandbox import environment, render  # noqa: E402

TEMPLATES = {
    "Ask-E probe prompt (text, if, 3 variables)": (ROOT / "specs/prompts/ask_e/probe.j2").read_text(),
    "loop over 10 records": "{% for x in xs %}{{ x }}{% endfor %}",
    "loop, attribute access": "{% for x in xs %}{{ x.name }}{% endfor %}",
    "loop, two filters": "{% for x in xs %}{{ x | string | upper }}{% endfor %}",
    "loop, %-formatting": "{% for x in xs %}{{ '%.2f' % x.v }}{% endfor %}",
}
VARIABLES = {"round": 2, "summary_a": "a" * 500, "summary_b": "b" * 500,
             "xs": [{"name": f"n{i}", "v": i / 3} for i in range(10)]}


def per_render(fn, n: int) -> float:
    """Median over 5 batches of n calls, in microseconds per call."""
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(samples)


def bench_render(n: int) -> None:
    plain = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    print(f"{'template':45s} {'plain µs':>9s} {'bounded µs':>11s} {'ratio':>6s}")
    for label, src in TEMPLATES.items():
        tp, tb = plain.from_string(src), environment().from_string(src)
        vp, vb = {**tp.globals, **VARIABLES}, {**tb.globals, **VARIABLES}
        assert "".join(tp.root_render_func(tp.new_context(vp, shared=True))) == render(tb, vb)
        a = per_render(lambda: "".join(tp.root_render_func(tp.new_context(vp, shared=True))), n)
        b = per_render(lambda: render(tb, vb), n)
        print(f"{label:45s} {a:9.1f} {b:11.1f} {b / a:6.2f}")


def bad_params(n: int) -> str:
    return "".join(f'param p{i}: int = "x"\n' for i in range(n))


def undefined_names(n: int) -> str:
    src = "".join(f"param p{i} = {i}\n" for i in range(n))
    src += 'model m = hf("x")\nrole q { model = m; prompt = "hi" }\ngame g {\n    r = ask q\n'
    return src + "".join(f"    v{i} = pp{i}\n" for i in range(n)) + "}\n"


def many_asks(n: int) -> str:
    src = "".join(f"param p{i} = {i}\n" for i in range(n))
    src += 'model m = hf("x")\nrole q { model = m; prompt = "hi {{ p1 }}" }\ngame g {\n'
    return src + "".join(f"    r{i} = ask q\n" for i in range(n)) + "}\n"


def bench_check(sizes: list[int]) -> None:
    print(f"\n{'spec':40s} {'N':>6s} {'diagnostics':>11s} {'check s':>8s}")
    for make in (bad_params, undefined_names, many_asks):
        for n in sizes:
            src = make(n)
            t = time.perf_counter()
            res = compile_source("t.ask", src)
            res.sink.emit(res.sources, io.StringIO(), limit=0)
            dt = time.perf_counter() - t
            print(f"{make.__name__:40s} {n:6d} {len(res.sink.items):11d} {dt:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--renders", type=int, default=20000)
    ap.add_argument("--sizes", default="2500,5000,10000,20000")
    args = ap.parse_args()
    bench_render(args.renders // 5)
    bench_check([int(x) for x in args.sizes.split(",")])


if __name__ == "__main__":
    main()
