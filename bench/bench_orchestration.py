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

    python bench/bench_orchestration.py [--sessions 2000] [--turns 8] [--repeats 3] [--before REF]

askspec's model is the same instant reply as a synchronous callable (which the python
backend runs on a worker thread, so that a slow or hung one can be stopped) and as an
async one (run on the event loop). With `--before REF` (a git commit), the same rows are
also measured on that commit's code (extracted to a temporary folder by `git archive`),
each askspec run in a fresh child process for both sides alike. Runs are interleaved
(every configuration once per round, `--repeats` rounds); the median run by CPU time is
reported.
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
model instant = python("bench_instant:{callable}")
role player { model = instant; memory = full; reply = sections("#Answer#");
              prompt = "Turn {{ t }} of {{ turns }}: continue the game." }
game play for i in range(1, sessions + 1) {
    repeat t in 1..turns { r = ask player }
}
"""


SPEC_CALLABLE = "reply"


class NullWriter:
    """Records nothing: isolates the interpreter's own cost from the store's."""

    def session_started(self, *a, **k):
        return 1

    def turn(self, *a, **k):
        pass

    reward = session_finished = group = match = turn


def askspec_side(sessions: int, turns: int, record: bool, callable_name: str = "reply") -> dict:
    global SPEC_CALLABLE
    SPEC_CALLABLE = callable_name
    sys.path.insert(0, str(HERE))
    from askspec.lang.compiler import compile_source
    try:  # as `askspec run` does for its own process (commands/run.py): the heap frozen per phase
        from askspec.runtime.commands.heap import frozen_heap
        around_phase = {"around_phase": frozen_heap}
    except ImportError:  # a commit before #21 item 5 (--before): its engine froze the heap itself
        around_phase = {}
    from askspec.runtime.commands.options import RunOptions
    from askspec.runtime.commands.resolver import ModelResolver
    from askspec.runtime.engine.session import Engine
    from askspec.runtime.engine.plan import plan_sessions
    from askspec.runtime.store.writer import RunWriter

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "overhead.ask"
        text = SPEC.replace("{callable}", SPEC_CALLABLE)
        spec.write_text(text)
        res = compile_source(str(spec), text, {"sessions": str(sessions), "turns": str(turns)})
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
        engine = Engine(exp, params=params, datasets={}, writer=writer, resolve_model=resolver.resolve, concurrency=64,
                        **around_phase)

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


def before_tree(ref: str, into: Path) -> Path:
    """The code of commit `ref` laid out as importable packages (askspec, askspec.runtime,
    askspec.tui), for a child process's PYTHONPATH."""
    root = HERE.parent
    raw = into / "raw"
    raw.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", ref, "askspec", "runtime", "tui"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(raw)], input=archive, check=True)
    pkg = into / "pkg"
    pkg.mkdir()
    (raw / "askspec").rename(pkg / "askspec")
    (raw / "runtime").rename(pkg / "askspec" / "runtime")
    (raw / "tui").rename(pkg / "askspec" / "tui")
    return pkg


def child_side(pythonpath: Path | None, sessions: int, turns: int, record: bool, callable_name: str) -> dict:
    """One askspec run (after a warm-up) in a fresh process, on this tree or another."""
    out = subprocess.run([sys.executable, __file__, "--child", "--sessions", str(sessions), "--turns", str(turns),
                          "--callable", callable_name] + (["--record"] if record else [])
                         + (["--tree", str(pythonpath)] if pythonpath is not None else []),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each configuration runs once per round")
    ap.add_argument("--skip-verifiers", action="store_true")
    ap.add_argument("--before", metavar="REF", help="also measure askspec at this git commit, interleaved")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--callable", default="reply", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        if args.tree:  # import askspec from there: drop the editable install's finder, which would win
            sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
            sys.path.insert(0, args.tree)
            import askspec.runtime

            assert askspec.runtime.__file__.startswith(args.tree), askspec.runtime.__file__
        askspec_side(20, args.turns, record=args.record, callable_name=args.callable)  # warm-up
        print(json.dumps(askspec_side(args.sessions, args.turns, record=args.record, callable_name=args.callable)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        trees: list[tuple[str, Path | None]] = [("now", None)]
        if args.before:
            trees.insert(0, (f"at {args.before}", before_tree(args.before, Path(tmp))))
        configs = []
        for record in (False, True):
            for callable_name, how in (("reply", "sync callable"), ("reply_async", "async callable")):
                for label, path in trees:
                    rec = "recording every turn" if record else "no recording"
                    name = f"askspec {label}, {how}, {rec}" if args.before else f"askspec, {how}, {rec}"
                    configs.append((name, record, (lambda p=path, r=record, c=callable_name:
                                                   child_side(p, args.sessions, args.turns, r, c))))
        if not args.skip_verifiers:
            configs.append(("verifiers 0.3.1 MultiTurnEnv", None, lambda: verifiers_side(args.sessions, args.turns)))
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in configs}
        for _ in range(args.repeats):
            for name, _, fn in configs:
                runs[name].append(fn())
    rows = [(name, sorted(runs[name], key=lambda r: r["cpu_ms_per_call"])[len(runs[name]) // 2]) for name, _, _ in configs]
    width = max(len(name) for name, _ in rows)
    print(f"{'engine':{width}s} {'calls':>8s} {'seconds':>9s} {'ms/call':>9s} {'cpu ms/call':>12s}  cpu ms/call of each run")
    for name, r in rows:
        each = ", ".join(f"{x['cpu_ms_per_call']:.4f}" for x in runs[name])
        print(f"{name:{width}s} {r['calls']:8d} {r['seconds']:9.3f} {r['ms_per_call']:9.4f} {r['cpu_ms_per_call']:12.4f}  {each}")
    if not args.skip_verifiers:
        vf = rows[-1][1]
        for (name, record, _), (_, r) in zip(configs[:-1], rows[:-1]):
            target = "≤ 0.05, issue #14" if record else "≤ 0.1"
            print(f"ratio {name} / verifiers: wall {r['ms_per_call'] / vf['ms_per_call']:.3f}, "
                  f"cpu {r['cpu_ms_per_call'] / vf['cpu_ms_per_call']:.3f}  (target {target})")
    print(f"(load average at end: {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
