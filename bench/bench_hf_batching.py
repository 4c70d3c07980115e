"""hf backend: tokens/s one request at a time vs N requests in flight (batched), side by side.

    python bench/bench_hf_batching.py [--requests 8] [--max-tokens 48] [--rounds 3] [--threads N]

Both modes run in the same process on the same loaded model, alternating round by round so
a change in machine load hits both alike; the figures are medians over rounds. Tokens/s
counts generated tokens (ChatResult.tokens_out) over wall time. Target (DESIGN.md): batched
>= 3x one-at-a-time with >= 8 sessions in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time

from askspec.runtime.backends.base import ChatRequest, Sampling
from askspec.runtime.backends.hf import HFBackend

PROMPTS = [
    "Write a detailed story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how photosynthesis works, step by step.",
    "Describe the history of the Roman Empire in several paragraphs.",
    "Write a long poem about autumn leaves and the passing of time.",
    "Give a thorough explanation of how a car engine works.",
    "Describe a day in the life of a medieval blacksmith in detail.",
    "Explain the water cycle to a curious ten-year-old, with many examples.",
    "Write a travel guide for a week in the mountains, day by day.",
    "Explain why the sky is blue, in depth.",
    "Tell a long fairy tale about a clever fox and a proud crow.",
    "Describe how computers store numbers, with examples.",
    "Write a letter to a friend describing your garden in spring.",
]


def _requests(n: int, max_tokens: int) -> list[ChatRequest]:
    return [
        ChatRequest(
            messages=({"role": "user", "content": PROMPTS[i % len(PROMPTS)]},),
            sampling=Sampling(temperature=0.7, top_p=0.95, max_tokens=max_tokens, seed=1000 + i),
            role="writer",
            session_index=i,
        )
        for i in range(n)
    ]


async def _one_at_a_time(backend: HFBackend, reqs: list[ChatRequest]) -> tuple[int, float]:
    start = time.perf_counter()
    tokens = 0
    for req in reqs:
        tokens += (await backend.complete(req)).tokens_out
    return tokens, time.perf_counter() - start


async def _in_flight(backend: HFBackend, reqs: list[ChatRequest]) -> tuple[int, float]:
    start = time.perf_counter()
    results = await asyncio.gather(*(backend.complete(r) for r in reqs))
    return sum(r.tokens_out for r in results), time.perf_counter() - start


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the backend's)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    args = ap.parse_args()

    backend = HFBackend(args.model, max_batch=args.requests, num_threads=args.threads)
    import torch

    # this script owns its process: torch's threads set here, as `askspec run` does, before the load thread
    torch.set_num_threads(backend.torch_threads())
    t0 = time.perf_counter()
    await asyncio.to_thread(backend.load)
    load_s = time.perf_counter() - t0

    reqs = _requests(args.requests, args.max_tokens)
    await backend.complete(reqs[0])  # warm-up: first-call allocations and lazy inits

    print(f"model {args.model}; load {load_s:.1f} s; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); {os.cpu_count()} CPU(s) ({platform.processor() or platform.machine()})")
    print(f"{args.requests} requests x {args.max_tokens} max tokens, temperature 0.7, top_p 0.95, seeded; "
          f"{args.rounds} round(s); load average at start {os.getloadavg()[0]:.2f}")
    single, batched = [], []
    for r in range(args.rounds):
        order = [("single", _one_at_a_time), ("batched", _in_flight)]
        if r % 2:
            order.reverse()  # alternate so drifting machine load does not favour one mode
        for name, run in order:
            tokens, secs = await run(backend, reqs)
            rate = tokens / secs
            (single if name == "single" else batched).append(rate)
            print(f"  round {r + 1} {name:8s} {tokens:4d} tokens in {secs:6.2f} s = {rate:6.1f} tok/s")
    s, b = statistics.median(single), statistics.median(batched)
    print(f"one at a time : {s:6.1f} tok/s (median)")
    print(f"{args.requests} in flight   : {b:6.1f} tok/s (median)")
    print(f"ratio         : {b / s:5.2f}x  (target >= 3x); load average at end {os.getloadavg()[0]:.2f}")
    await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main())
