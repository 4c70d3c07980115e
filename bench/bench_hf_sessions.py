"""hf backend throughput at the session level: the same 8 sessions run through
`askspec run`'s engine one at a time (--concurrency 1) and all in flight (--concurrency 8),
side by side in one process. Target: >= 3x the tokens/s.

    python bench/bench_hf_sessions.py [--sessions 8] [--tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

SPEC = """
experiment hf_sessions {{ param n: int = {n} }}
model m = hf("smollm2-135m-instruct") {{ temperature = 0.7; top_p = 0.95; max_tokens = {tokens} }}
role writer {{ model = m; memory = none; prompt = "Write a short story about the number {{{{ i }}}}." }}
game tell for i in range(1, n + 1) {{ story = ask writer }}
"""


async def one_run(spec: Path, out: Path, concurrency: int) -> tuple[float, int]:
    from askspec.runtime.commands.run import run_spec
    from askspec.runtime.store.views import open_store

    t0 = time.perf_counter()
    # own_process: the torch threads and heap freezing `askspec run` gives its process
    rc, run_dir = await run_spec(str(spec), out=str(out), concurrency=concurrency, seed=1, own_process=True)
    elapsed = time.perf_counter() - t0
    assert rc == 0
    tokens = open_store(run_dir).execute("select sum(tokens_out) from turns").fetchone()[0]
    return elapsed, int(tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    from askspec.runtime.backends.registry import make_backend

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "hf_sessions.ask"
        spec.write_text(SPEC.format(n=args.sessions, tokens=args.tokens))
        rows = []
        for concurrency in (1, args.sessions):
            # a run closes its backends at the end: load the shared instance again first,
            # so neither timing includes loading the model
            make_backend("hf", "smollm2-135m-instruct", {}).load()
            elapsed, tokens = asyncio.run(one_run(spec, Path(tmp) / f"c{concurrency}", concurrency))
            rows.append((concurrency, elapsed, tokens, tokens / elapsed))
    print(f"{'sessions in flight':>18s} {'seconds':>8s} {'tokens':>7s} {'tok/s':>7s}")
    for c, e, t, r in rows:
        print(f"{c:18d} {e:8.2f} {t:7d} {r:7.1f}")
    print(f"ratio: {rows[1][3] / rows[0][3]:.2f}x  (target >= 3x)")


if __name__ == "__main__":
    main()
