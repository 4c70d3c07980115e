"""Benchmark: scoring one new question against the diversity buffers.

Measures, per new item:
  1. Ask-E window scoring alone (precomputed 384-d embeddings, 5,000-item window):
     one matrix-vector product + partial sort for the k = 5 nearest; target < 5 ms.
  2. The same plus the ring-buffer insert (score_and_add on a vector).
  3. End to end with the real all-MiniLM-L6-v2 embedding of the new question (CPU).
  4. PasoDoble's Jaccard history (|H| = 100): r_div, and r_div + add.
  5. Beside the diversity figures: one Bradley-Terry fit for a live tournament group
     (N = 8, 18 matches mirrored), with the fit's single-thread BLAS limit and without.

Usage:  python bench/bench_diversity.py [--items 2000] [--e2e-items 100] [--skip-minilm]
Run with the package importable (installed, or PYTHONPATH pointing at a shim).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time

import numpy as np

from askspec.runtime.scoring import bradley_terry as bt
from askspec.runtime.scoring.diversity import EmbeddingDiversity, JaccardHistory, MiniLMEmbedder

WORDS = ("integer prime divisible sum product triangle circle radius area probability "
         "sequence function polynomial root real complex matrix vector angle perimeter "
         "maximum minimum remainder digit count ways choose arrange distinct positive "
         "negative equation solve find compute value expression greater less than equal").split()


def synthetic_questions(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 40)))
        out.append(f"Find the {rng.choice(WORDS)} of {body} when n = {rng.randint(2, 999)}?")
    return out


def summarise(label: str, samples_ns: list[int]) -> dict[str, float]:
    ms = sorted(s / 1e6 for s in samples_ns)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    row = {"mean_ms": statistics.fmean(ms), "median_ms": statistics.median(ms), "p95_ms": p95}
    print(f"{label:<58} mean {row['mean_ms']:8.4f} ms   median {row['median_ms']:8.4f} ms   "
          f"p95 {p95:8.4f} ms   (n={len(ms)})")
    return row


def time_each(fn, items) -> list[int]:
    out = []
    for it in items:
        t0 = time.perf_counter_ns()
        fn(it)
        out.append(time.perf_counter_ns() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2000, help="new items for the vector benchmarks")
    ap.add_argument("--e2e-items", type=int, default=100, help="new questions embedded with MiniLM")
    ap.add_argument("--window", type=int, default=5000)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--skip-minilm", action="store_true")
    ap.add_argument("--embed-window", action="store_true",
                    help="fill the end-to-end window with real MiniLM embeddings (~40 s on 2 cores) "
                         "instead of random unit vectors (same cost to score against)")
    args = ap.parse_args()

    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
          f"{platform.machine()}, load average {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    dim = MiniLMEmbedder.dim

    # 1-2: precomputed embeddings, full 5,000-item window
    div = EmbeddingDiversity(alpha=1.0, k=args.k, window=args.window, embed=lambda t: None)
    div.add_vectors(rng.standard_normal((args.window, dim)).astype(np.float32))
    assert len(div) == args.window
    new = rng.standard_normal((args.items, dim)).astype(np.float32)
    for v in new[:50]:  # warm-up
        div.score_vector(v)
    results = {}
    results["window_score"] = summarise(
        f"Ask-E score vs {args.window}-item window (precomputed emb.)", time_each(div.score_vector, new))

    def score_add(v):
        div.score_vector(v)
        div.add_vectors(v)

    results["window_score_add"] = summarise(
        f"Ask-E score + ring insert ({args.window} window)", time_each(score_add, new))

    # 3: end to end with MiniLM
    if not args.skip_minilm:
        emb = MiniLMEmbedder()
        t0 = time.perf_counter()
        emb(["warm-up question"])
        print(f"{'MiniLM load + first embedding':<58} {time.perf_counter() - t0:8.2f} s")
        import torch

        print(f"{'torch intra-op threads':<58} {torch.get_num_threads()}")
        qs = synthetic_questions(args.window + args.e2e_items, seed=1)
        e2e = EmbeddingDiversity(alpha=1.0, k=args.k, window=args.window, embed=emb)
        if args.embed_window:
            t0 = time.perf_counter()
            e2e.add_vectors(emb(qs[: args.window]))
            fill_s = time.perf_counter() - t0
            print(f"{'MiniLM batch-embed the 5,000-question window':<58} {fill_s:8.2f} s "
                  f"({fill_s / args.window * 1e3:.2f} ms/question)")
        else:
            e2e.add_vectors(rng.standard_normal((args.window, dim)).astype(np.float32))
        fresh = qs[args.window:]
        results["e2e_score_and_add"] = summarise(
            "End to end: MiniLM embed 1 question + score + insert", time_each(e2e.score_and_add, fresh))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # this script owns its process: torch's setting is the process's
        results["e2e_score_and_add_1thread"] = summarise(
            "  same, torch.set_num_threads(1)",
            time_each(e2e.score_and_add, synthetic_questions(args.e2e_items, seed=6)))
        torch.set_num_threads(threads)
        t0 = time.perf_counter_ns()
        e2e.score_and_add_many(synthetic_questions(64, seed=2))
        per = (time.perf_counter_ns() - t0) / 64 / 1e6
        print(f"{'End to end, batch of 64 (one embed call), per question':<58} mean {per:8.4f} ms")
        results["e2e_batch64_ms"] = per

    # 4: PasoDoble Jaccard history
    qs = synthetic_questions(100 + args.items, seed=3)
    hist = JaccardHistory(capacity=100, tau_sim=0.3)
    for q in qs[:100]:
        hist.add(q)
    results["jaccard_r_div"] = summarise("PasoDoble r_div vs 100-question history",
                                         time_each(hist.r_div, qs[100:]))
    results["jaccard_r_div_add"] = summarise("PasoDoble r_div + add (100-question history)",
                                             time_each(hist.r_div_and_add, qs[100:]))

    # 5: Bradley-Terry fit of one live-tournament group
    fit_rng = random.Random(4)
    observed = [(k, o, fit_rng.choice((1.0, 0.5, 0.0))) for k in range(1, 8)
                for o in sorted({0, k - 1, (k - 1) // 2})]
    assert len(observed) == 18
    matches = bt.mirror(observed)
    results["bt_fit"] = summarise("Bradley-Terry fit, N = 8, 18 matches (1 BLAS thread)",
                                  time_each(lambda _: bt.fit_bradley_terry(8, matches), range(200)))
    i, j, o = bt._as_arrays(8, matches)
    results["bt_fit_threads"] = summarise("  same L-BFGS-B call without the BLAS thread limit",
                                          time_each(lambda _: bt._minimize(i, j, o, 8, 1.0), range(200)))

    target = results["window_score"]["median_ms"]
    print(f"\nwindow scoring target < 5 ms per new item: median {target:.4f} ms -> "
          f"{'OK' if target < 5 else 'MISSED'}")


if __name__ == "__main__":
    main()
