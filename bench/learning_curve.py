"""Learning curve of the local trainer: SmolLM2-135M trained with GRPO on specs/arith.ask
(sums with boxed answers, shipped data) on the CPU, three seeds, one after the other.

    .venv/bin/python bench/learning_curve.py [--seeds 0 1 2] [--out runs/curve] [--set steps=24]

For each seed: `askspec run specs/arith.ask --seed S`, then the mean reward of the first
and of the last 10 steps (from the run's `train_steps` view) and the wall time. Writes
bench/learning_curve.json and docs/training_curve.png (matplotlib), prints a Markdown
table for docs/training.md. Not a test: it takes tens of minutes on two cores."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=str(ROOT / "runs" / "curve"))
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--window", type=int, default=10)
    args = ap.parse_args()
    from askspec.runtime.store.views import open_store

    results = []
    for seed in args.seeds:
        t0 = time.time()
        cmd = [sys.executable, "-m", "askspec.cli", "run", str(ROOT / "specs" / "arith.ask"), "--seed", str(seed),
               "--out", args.out, "--quiet", *[x for s in args.set for x in ("--set", s)]]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.time() - t0
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        run_dir = proc.stdout.strip().splitlines()[-1]
        con = open_store(run_dir)
        rows = con.execute("SELECT step, reward_mean, loss, grad_norm, seconds, mismatch_kl, clip_frac FROM train_steps "
                           "ORDER BY step").fetchall()
        rewards = [r[1] for r in rows]
        w = args.window
        first, last = sum(rewards[:w]) / w, sum(rewards[-w:]) / w
        acc = con.execute("SELECT avg(CASE WHEN (vars->>'$.correct')::BOOLEAN THEN 1 ELSE 0 END), "
                          "avg(CASE WHEN (vars->>'$.has_box')::BOOLEAN THEN 1 ELSE 0 END) FROM sessions").fetchone()
        results.append({"seed": seed, "run_dir": run_dir, "steps": len(rows), "rewards": rewards, "first": first,
                        "last": last, "wall_s": wall, "step_s": [r[4] for r in rows], "accuracy": acc[0],
                        "boxed_rate": acc[1],
                        # on-policy: the sampler played the trained weights (docs/training.md, mismatch)
                        "mismatch_kl_max": max((r[5] for r in rows if r[5] is not None), default=None),
                        "clip_frac_max": max((r[6] for r in rows if r[6] is not None), default=None)})
        print(f"seed {seed}: first {w} steps {first:.3f}, last {w} {last:.3f}, {wall:.0f} s; mismatch KL max "
              f"{results[-1]['mismatch_kl_max']}, clip max {results[-1]['clip_frac_max']}", flush=True)
    (ROOT / "bench" / "learning_curve.json").write_text(json.dumps(results, indent=2))
    print(f"\n| seed | mean reward, steps 1–{args.window} | mean reward, last {args.window} steps | wall time | "
          "mismatch KL (max) | clip (max) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['seed']} | {r['first']:.3f} | {r['last']:.3f} | {r['wall_s'] / 60:.1f} min | "
              f"{'-' if r['mismatch_kl_max'] is None else format(r['mismatch_kl_max'], '.1e')} | "
              f"{100 * (r['clip_frac_max'] or 0):.0f}% |")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[dev]')", file=sys.stderr)
        return 0
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot(range(1, len(r["rewards"]) + 1), r["rewards"], marker="o", ms=3, label=f"seed {r['seed']}")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward of the step's rollouts")
    ax.set_title("GRPO on specs/arith.ask, SmolLM2-135M-Instruct, CPU")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "training_curve.png", dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
