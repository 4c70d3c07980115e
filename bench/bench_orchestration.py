"""Orchestration overhead per model call: askspec's engine vs verifiers 0.3.1.

Both sides play the same game: one role, 8 turns per session, full conversation memory,
a backend/client that answers instantly in-process, many sessions. What is measured is
everything but the model: templating, parsing, history, bookkeeping, scheduling (and for
askspec, recording every turn to the run store, reported separately).

askspec runs in this process; verifiers runs in a child process from its own virtual
environment (verifiers pins its own openai/datasets versions), created on first use at
bench/.venv-verifiers unless $VERIFIERS_PYTHON points at a Python that has it. Both are
timed in the same invocation, side by side; wall-clock and process CPU time are both
reported (CPU time is the steadier figure on a shared machine).

    python bench/bench_orchestration.py [--sessions 2000] [--turns 8] [--repeats 3]

Each engine runs `--repeats` times; the run with the median CPU time is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SPEC = """
experiment overhead { param sessions: int = 100  param turns: int = 8 }
model instant = python("bench_instant:reply")
role player { model = instant; memory = full; reply = sections("#Answer#");
              prompt = "Turn {{ t }} of {{ turns }}: continue the game." }
game play for i in range(1, sessions + 1) {
    repeat t in 1..turns { r = ask player }
}
"""


class NullWriter:
    """Records nothing: isolates the interpreter's own cost from the store's."""

    def session_started(self, *a, **k):
        return 1

    def turn(self, *a, **k):
        pass

    reward = session_finished = group = match = turn


def askspec_side(sessions: int, turns: int, record: bool) -> dict:
    sys.path.insert(0, str(HERE))
    from askspec.lang.compiler import compile_source
    from askspec.runtime.commands.options import RunOptions
    from askspec.runtime.commands.resolver import ModelResolver
    from askspec.runtime.engine.session import Engine
    from askspec.runtime.engine.plan import plan_sessions
    from askspec.runtime.store.writer import RunWriter

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "overhead.ask"
        spec.write_text(SPEC)
        res = compile_source(str(spec), SPEC, {"sessions": str(sessions), "turns": str(turns)})
        assert res.ok, [d.message for d in res.sink.items]
        exp = res.ir
        params = exp.param_values()
        plans = plan_sessions(exp, params, {}, 0)
        if record:
            from askspec.ir.canonical import experiment_hash, to_json

            writer = RunWriter.create(Path(tmp) / "runs", experiment=exp.name, experiment_hash=experiment_hash(exp),
                                      ir_json=to_json(exp), spec_files={"overhead.ask": SPEC}, seed=0, roles={},
                                      params=params, planned_sessions=len(plans), argv=[])
        else:
            writer = NullWriter()
        resolver = ModelResolver(exp, RunOptions(file=str(spec)), tmp)
        engine = Engine(exp, params=params, datasets={}, writer=writer, resolve_model=resolver.resolve, concurrency=64)

        async def go():
            c0, t0 = time.process_time(), time.perf_counter()
            results = await engine.run(plans)
            return time.perf_counter() - t0, time.process_time() - c0, results

        elapsed, cpu, results = asyncio.run(go())
        if record:
            writer.finish("finished")
        assert all(r.status == "ok" for r in results), results[0].error
    calls = sessions * turns
    return {"calls": calls, "seconds": elapsed, "ms_per_call": 1000 * elapsed / calls, "cpu_ms_per_call": 1000 * cpu / calls}


def verifiers_python() -> str:
    env = os.environ.get("VERIFIERS_PYTHON")
    if env:
        return env
    venv = HERE / ".venv-verifiers"
    py = venv / "bin" / "python"
    if not py.exists():
        print("creating bench/.venv-verifiers with verifiers==0.3.1 (first run only) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "verifiers==0.3.1"], check=True)
    return str(py)


def verifiers_side(sessions: int, turns: int) -> dict:
    out = subprocess.run([verifiers_python(), str(HERE / "verifiers_side.py"), "--sessions", str(sessions), "--turns", str(turns)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per engine; the median is reported")
    ap.add_argument("--skip-verifiers", action="store_true")
    args = ap.parse_args()

    def median_run(fn) -> dict:
        runs = sorted((fn() for _ in range(args.repeats)), key=lambda r: r["cpu_ms_per_call"])
        return runs[len(runs) // 2]

    # warm-up (imports, template compilation) outside the timed runs
    askspec_side(20, args.turns, record=False)
    rows = [("askspec (no recording)", median_run(lambda: askspec_side(args.sessions, args.turns, record=False))),
            ("askspec (recording every turn)", median_run(lambda: askspec_side(args.sessions, args.turns, record=True)))]
    if not args.skip_verifiers:
        rows.append(("verifiers 0.3.1 MultiTurnEnv", median_run(lambda: verifiers_side(args.sessions, args.turns))))
    print(f"{'engine':34s} {'calls':>8s} {'seconds':>9s} {'ms/call':>9s} {'cpu ms/call':>12s}")
    for name, r in rows:
        print(f"{name:34s} {r['calls']:8d} {r['seconds']:9.3f} {r['ms_per_call']:9.4f} {r['cpu_ms_per_call']:12.4f}")
    if not args.skip_verifiers:
        vf = rows[-1][1]
        for name, r in rows[:-1]:
            target = "≤ 0.05, issue #14" if "recording" in name and "no recording" not in name else "≤ 0.1"
            print(f"ratio {name} / verifiers: wall {r['ms_per_call'] / vf['ms_per_call']:.3f}, "
                  f"cpu {r['cpu_ms_per_call'] / vf['cpu_ms_per_call']:.3f}  (target {target})")
    print(f"(load average at end: {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
