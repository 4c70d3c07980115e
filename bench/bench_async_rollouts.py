"""Wall time per training step with asynchronous rollouts (`max_staleness = 1`: step t's
update overlaps step t + 1's play) against on-policy steps (`max_staleness = 0`: play,
then update), on the same spec and seed, side by side: `askspec run` on the CPU with a
tiny random Llama (SmolLM2's tokenizer, like the tests' `tiny_model`).

    .venv/bin/python bench/bench_async_rollouts.py [--repeats 2] [--steps 6] [--batch 8] [--max-tokens 32]

Each repeat runs K = 0 and K = 1 one after the other (alternating, so that both see the
same load). Per-step wall time is the steady state: (last step's train_steps time − first
step's) / (steps − 1), so model loading and the first step (which has no update to
overlap) are left out. Also printed: the mean play and update seconds of a step
(train_steps metrics seconds_play, seconds_update), whose sum is what an on-policy step
costs and whose maximum is what a perfect overlap would cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tiny_llama import build_tiny_llama  # bench/, beside this script

SPEC = """experiment bench {{ seed = 7 }}
model m = hf("{model}") {{ max_tokens = {max_tokens}; temperature = 1.0 }}
role a {{ model = m; memory = none; prompt = "Count from {{{{ i }}}} to {{{{ i + 20 }}}}, separated by commas."; trained }}
game g for i in range(0, 64) {{
    x = ask a
    reward a = len(x.text)
}}
train a with grpo {{ group = {group}; batch = {batch}; steps = {steps}; lr = 0.0001; save_every = 1000; max_staleness = {k} }}
"""


def one_run(tmp: Path, model: Path, k: int, args: argparse.Namespace, repeat: int) -> dict[str, float]:
    from askspec.runtime.store.views import open_store

    folder = tmp / f"k{k}-r{repeat}"
    folder.mkdir()
    spec = folder / "bench.ask"
    spec.write_text(SPEC.format(model=model, max_tokens=args.max_tokens, group=args.group, batch=args.batch,
                                steps=args.steps, k=k))
    done = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(spec), "--out", str(folder / "runs"),
                           "--quiet"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"K = {k}: askspec run failed:\n{done.stderr}")
    (run,) = [p for p in (folder / "runs").iterdir() if not p.name.startswith(".")]
    con = open_store(run)
    rows = con.execute("SELECT step, epoch(ts), (metrics->>'seconds_play')::DOUBLE, "
                       "(metrics->>'seconds_update')::DOUBLE, tokens FROM train_steps ORDER BY step").fetchall()
    assert [r[0] for r in rows] == list(range(1, args.steps + 1)), rows
    later = rows[1:]  # step 1 has no update before it to overlap with
    return {"per_step": (rows[-1][1] - rows[0][1]) / (len(rows) - 1),
            "play": statistics.mean(r[2] for r in later), "update": statistics.mean(r[3] for r in later),
            "tokens": statistics.mean(r[4] for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="sessions per step")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        model = tmp / "tiny"
        build_tiny_llama(model, args.hidden, args.layers)
        results: dict[int, list[dict[str, float]]] = {0: [], 1: []}
        loads = [os.getloadavg()[0]]
        for r in range(args.repeats):
            for k in (0, 1):
                results[k].append(one_run(tmp, model, k, args, r))
                loads.append(os.getloadavg()[0])
    print(f"tiny Llama (hidden {args.hidden}, {args.layers} layers), {args.steps} steps of {args.batch} sessions "
          f"(groups of {args.group}), up to {args.max_tokens} new tokens each; {os.cpu_count()} CPUs, load average "
          f"{min(loads):.1f}-{max(loads):.1f}; median of {args.repeats} runs per K")
    print(f"{'max_staleness':<15}{'s/step (wall)':>15}{'play s':>10}{'update s':>10}{'play+update':>13}"
          f"{'max(play,update)':>18}{'tokens/step':>13}")
    med = {}
    for k, runs in results.items():
        m = {key: statistics.median(x[key] for x in runs) for key in runs[0]}
        med[k] = m
        print(f"{k:<15}{m['per_step']:>15.3f}{m['play']:>10.3f}{m['update']:>10.3f}{m['play'] + m['update']:>13.3f}"
              f"{max(m['play'], m['update']):>18.3f}{m['tokens']:>13.1f}")
    print(f"K = 1 / K = 0 wall time per step: {med[1]['per_step'] / med[0]['per_step']:.2f} "
          f"(perfect overlap of K = 0's play and update: "
          f"{max(med[0]['play'], med[0]['update']) / (med[0]['play'] + med[0]['update']):.2f})")
    for k, runs in results.items():
        print(f"  K = {k} per run, s/step: " + ", ".join(f"{x['per_step']:.3f}" for x in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
