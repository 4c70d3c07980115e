"""The update of a training step with no learning signal (every group's rewards equal, so
every advantage is 0) against a normal one, side by side on one tiny random Llama
(SmolLM2's tokenizer, like the tests' `tiny_model`): the skipped step runs no forward or
backward pass (docs/training.md, "Skipped steps").

    .venv/bin/python bench/bench_skip_step.py [--repeats 7] [--trajectories 8] [--prompt 256] [--completion 64]

Each repeat times `TrainedPolicy.update` (its own `seconds_update`) on the same batch
twice: once with equal rewards in each group of 2 (skipped: zero_advantage), once with
rewards that differ (the full update: forward, backward, AdamW). Prints the medians and
their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from tiny_llama import build_tiny_llama  # bench/, beside this script


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--trajectories", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens per trajectory")
    ap.add_argument("--completion", type=int, default=64, help="completion tokens per trajectory")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()

    import torch

    from askspec.ir import model as ir
    from askspec.lang.training import lower_training
    from askspec.runtime.train.batch import Trajectory, Turn
    from askspec.runtime.train.config import config_from_ir
    from askspec.runtime.train.policy import TrainedPolicy

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny"
        build_tiny_llama(folder, args.hidden, args.layers)
        exp = lower_training(ir.Experiment(name="bench", roles=[ir.Role(name="r", trained=True)],
                                           training=[ir.Training(role="r", algorithm="grpo")]), {"r": {"lr": 1e-5}})
        policy = TrainedPolicy(config_from_ir(exp.training[0], exp), str(folder), {"num_threads": 1})
        gen = torch.Generator().manual_seed(0)

        def batch(rewards: list[float]) -> list[Trajectory]:
            out = []
            for i, r in enumerate(rewards):
                prompt = torch.randint(3, 1000, (args.prompt,), generator=gen).tolist()
                completion = torch.randint(3, 1000, (args.completion,), generator=gen).tolist()
                out.append(Trajectory(f"s{i}/r", f"g{i // 2}", r, [Turn(f"s{i}", 1, 0, prompt, completion,
                                                                         [-7.0] * len(completion), 1.0, "length")]))
            return out

        n = args.trajectories
        skipped, normal = [], []
        policy.update(batch([float(i % 2) for i in range(n)]))  # warm-up: the first forward allocates
        for _ in range(args.repeats):
            m = policy.update(batch([1.0] * n))
            assert m.get("skipped") == "zero_advantage", m
            skipped.append(m["seconds_update"])
            m = policy.update(batch([float(i % 2) for i in range(n)]))
            assert m.get("skipped") is None and m["loss"] is not None, m
            normal.append(m["seconds_update"])
    s, u = statistics.median(skipped), statistics.median(normal)
    print(f"tiny Llama (hidden {args.hidden}, {args.layers} layers), {n} trajectories of {args.prompt} prompt + "
          f"{args.completion} completion tokens, groups of 2, median of {args.repeats}, 1 torch thread")
    print(f"{'step':<30}{'update s (median)':>20}{'min':>12}{'max':>12}")
    print(f"{'normal (rewards differ)':<30}{u:>20.4f}{min(normal):>12.4f}{max(normal):>12.4f}")
    print(f"{'skipped (zero_advantage)':<30}{s:>20.6f}{min(skipped):>12.6f}{max(skipped):>12.6f}")
    print(f"skipped / normal: {s / u:.5f} ({u / s:,.0f}x less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
