"""hf backend on multi-turn conversations: KV-prefix reuse on vs off, 1 and N conversations in flight.

    python bench/bench_hf_multiturn.py [--conversations 8] [--solo 2] [--turns 4]
                                       [--max-tokens 64] [--rounds 2] [--threads N]
                                       [--modes c1-off,c1-on,c8-off,c8-on] [--profile FILE]
                                       [--quantize none,int8]

Each conversation is what the engine sends a role with `memory = full`: a system prompt, a
~400-token first user message (a passage to discuss), then per turn the whole history so far
(every earlier user turn and reply) plus a new ~40-token question, so prompts grow from
~400 to ~800 tokens. One backend per reuse setting (`prefix_cache` on / off), both loaded
once; the modes run interleaved, round after round, alternating their order, so a change
in machine load hits all of them. "c1" runs `--solo` conversations one after another (one
request at a time); "cN" runs `--conversations` conversations together (the backend
batches them). Figures: generated tokens/s (tokens_out / wall), prompt tokens/s
(tokens_in / wall: the prompt tokens served, reused or not), median time to the first
generated token, and how many prompt tokens were actually prefilled (the rest came from
the cache). Medians over rounds.

`--quantize none,int8` measures each mode once per quantize setting (the hf `quantize` option),
interleaved too: modes are then named like "c1-on-int8".

`--profile FILE` runs one mode once under cProfile and writes the stats (no timing table).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import platform
import pstats
import statistics
import time

from askspec.runtime.backends.base import ChatRequest, Sampling
from askspec.runtime.backends.hf import HFBackend

SYSTEM = "You are a careful reading assistant. Answer questions about the passage briefly and precisely."

PASSAGES = [
    "The lighthouse on the northern cape was built in 1871 from granite quarried on the island itself. "
    "For ninety years its lamp burned paraffin, and the keepers carried the fuel up one hundred and twelve "
    "steps every evening. In winter storms the waves reached the gallery, and the keepers logged the height "
    "of each wave against marks painted on the tower. ",
    "Photosynthesis takes place in the chloroplasts of plant cells. Light energy is absorbed by chlorophyll "
    "and used to split water molecules, releasing oxygen. The energy is stored in ATP and NADPH, which the "
    "Calvin cycle then uses to fix carbon dioxide into sugars. Plants in hot, dry climates use variations "
    "of this process to save water. ",
    "The Roman road network covered more than eighty thousand kilometres at its height. Roads were built in "
    "layers: large stones at the bottom, then gravel and sand, and finally paving slabs on main routes. "
    "Milestones recorded the distance to the nearest city, and way stations offered fresh horses to "
    "official messengers. ",
    "A medieval blacksmith's forge burned charcoal, which reaches higher temperatures than wood. The smith "
    "heated iron until it glowed orange, then hammered it on the anvil, reheating it many times. Quenching "
    "in water or oil hardened the metal, and tempering over a gentler heat made it less brittle. ",
]

QUESTIONS = [
    "Summarise the passage in two sentences, then name the most surprising detail in it.",
    "Which numbers appear in the passage, and what does each of them measure? List them.",
    "Explain the main process described in the passage step by step, as if to a student.",
    "What question would you ask the author to learn more? Give a reason for your question.",
    "Rewrite the first sentence of the passage for a young child, and explain your changes.",
    "Which detail of the passage would be hardest to check today, and how would you check it?",
]


def _first_message(conv: int) -> str:
    # ~350 tokens: a passage repeated with a varying lead, different per conversation
    base = PASSAGES[conv % len(PASSAGES)]
    return f"Passage {conv + 1}:\n" + base * 5 + "\n\n" + QUESTIONS[conv % len(QUESTIONS)]


async def _conversation(backend: HFBackend, conv: int, turns: int, max_tokens: int, stats: dict) -> None:
    history: list[dict[str, str]] = []
    for turn in range(turns):
        user = _first_message(conv) if turn == 0 else QUESTIONS[(conv + turn) % len(QUESTIONS)]
        messages = [{"role": "system", "content": SYSTEM}, *history, {"role": "user", "content": user}]
        first: list[float] = []
        sent = time.perf_counter()

        def on_tokens(n: int, first: list[float] = first) -> None:
            if not first:
                first.append(time.perf_counter())

        req = ChatRequest(messages=tuple(messages), role="reader", session_index=conv, call_index=turn,
                          sampling=Sampling(temperature=0.7, top_p=0.95, max_tokens=max_tokens,
                                            seed=7919 * conv + turn),
                          on_tokens=on_tokens)
        result = await backend.complete(req)
        stats["out"] += result.tokens_out
        stats["in"] += result.tokens_in
        stats["prompt_max"] = max(stats["prompt_max"], result.tokens_in)
        stats["prompt_min"] = min(stats["prompt_min"], result.tokens_in)
        if first:
            stats["ttft"].append(first[0] - sent)
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": result.text}]


async def run_mode(backend: HFBackend, conversations: int, turns: int, max_tokens: int, together: bool) -> dict:
    stats = {"out": 0, "in": 0, "ttft": [], "prompt_max": 0, "prompt_min": 1 << 30}
    backend.forget_prefixes()  # every mode starts cold, as a fresh run would
    before = backend.prefix_stats()
    start = time.perf_counter()
    if together:
        await asyncio.gather(*(_conversation(backend, c, turns, max_tokens, stats) for c in range(conversations)))
    else:
        for c in range(conversations):
            await _conversation(backend, c, turns, max_tokens, stats)
    wall = time.perf_counter() - start
    after = backend.prefix_stats()
    prefilled = after["prefilled"] - before["prefilled"]
    return {"wall": wall, "gen_tps": stats["out"] / wall, "prompt_tps": stats["in"] / wall,
            "ttft": statistics.median(stats["ttft"]) if stats["ttft"] else float("nan"),
            "tokens_out": stats["out"], "tokens_in": stats["in"], "prefilled": prefilled,
            "prompts": (stats["prompt_min"], stats["prompt_max"])}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=8, help="conversations in flight in the batched modes")
    ap.add_argument("--solo", type=int, default=2, help="conversations run one after another in the c1 modes")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the backend's)")
    ap.add_argument("--modes", default="c1-off,c1-on,cN-off,cN-on")
    ap.add_argument("--profile", default=None, help="profile the first mode once into this file")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--quantize", default="none", help="comma-separated hf quantize settings to measure (none,int8,fp16)")
    args = ap.parse_args()

    quantize = [q.strip() for q in args.quantize.split(",") if q.strip()]
    backends = {(flag if q == "none" else f"{flag}-{q}"): HFBackend(args.model, max_batch=args.conversations,
                                                                   num_threads=args.threads,
                                                                   prefix_cache=(flag == "on"), quantize=q)
                for flag in ("off", "on") for q in quantize}
    import torch

    # this script owns its process: torch's threads set here, as `askspec run` does, before any load thread
    torch.set_num_threads(next(iter(backends.values())).torch_threads())
    for b in backends.values():
        await asyncio.to_thread(b.load)

    modes = [m.strip() if q == "none" else f"{m.strip()}-{q}"
             for m in args.modes.split(",") if m.strip() for q in quantize]

    async def run(mode: str) -> dict:
        size, flag = mode.split("-", 1)
        together = size != "c1"
        n = args.conversations if together else args.solo
        return await run_mode(backends[flag], n, args.turns, args.max_tokens, together)

    if args.profile:
        # The forward passes run on the backend's worker thread: profile that thread, and
        # time prefill (_admit) apart from decode (_decode_step).
        size, flag = modes[0].split("-", 1)
        b = backends[flag]
        prof = cProfile.Profile()
        spent = {"_admit": 0.0, "_decode_step": 0.0}
        for name in spent:
            inner = getattr(b, name)

            def timed(*a, _inner=inner, _name=name):
                t = time.perf_counter()
                try:
                    return _inner(*a)
                finally:
                    spent[_name] += time.perf_counter() - t

            setattr(b, name, timed)
        b._worker = lambda: prof.runcall(HFBackend._worker, b)
        res = await run(modes[0])
        await b.aclose()
        prof.dump_stats(args.profile)
        print(modes[0], {k: v for k, v in res.items()})
        print(f"worker: prefill (_admit) {spent['_admit']:.1f} s, decode (_decode_step) {spent['_decode_step']:.1f} s "
              f"of {res['wall']:.1f} s wall")
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
        for other in backends.values():
            await other.aclose()
        return

    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{args.conversations} conversations in flight (cN), {args.solo} one at a time (c1); {args.turns} turns, "
          f"max_tokens {args.max_tokens}, temperature 0.7, top_p 0.95, seeded")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for rnd in range(args.rounds):
        order = modes if rnd % 2 == 0 else list(reversed(modes))
        for mode in order:
            res = await run(mode)
            results[mode].append(res)
            print(f"  round {rnd + 1} {mode:7s} {res['wall']:7.1f} s  gen {res['gen_tps']:6.1f} tok/s  "
                  f"prompt {res['prompt_tps']:7.1f} tok/s  ttft {res['ttft']:.2f} s  "
                  f"prefilled {res['prefilled']}/{res['tokens_in']}  prompts {res['prompts'][0]}-{res['prompts'][1]} "
                  f"tokens  load {os.getloadavg()[0]:.1f}", flush=True)
    print()
    print("| mode | gen tok/s | prompt tok/s | median TTFT s | prompt tokens prefilled |")
    print("|---|---:|---:|---:|---:|")
    med = {}
    for mode in modes:
        rs = results[mode]
        med[mode] = statistics.median(r["gen_tps"] for r in rs)
        print(f"| {mode} | {med[mode]:.1f} | {statistics.median(r['prompt_tps'] for r in rs):.1f} | "
              f"{statistics.median(r['ttft'] for r in rs):.2f} | "
              f"{sum(r['prefilled'] for r in rs)}/{sum(r['tokens_in'] for r in rs)} |")
    for flag in ("off", "on"):
        for q in quantize:
            if q != "none" and f"cN-{flag}-{q}" in med and f"cN-{flag}" in med and f"c1-{flag}-{q}" in med and f"c1-{flag}" in med:
                print(f"reuse {flag}: {q} / float32 = c1 {med[f'c1-{flag}-{q}'] / med[f'c1-{flag}']:.2f}x, "
                      f"cN {med[f'cN-{flag}-{q}'] / med[f'cN-{flag}']:.2f}x")
    for size in ("c1", "cN"):
        if f"{size}-on" in med and f"{size}-off" in med:
            print(f"{size}: reuse on / off = {med[f'{size}-on'] / med[f'{size}-off']:.2f}x")
    for flag in backends:
        if f"cN-{flag}" in med and f"c1-{flag}" in med:
            print(f"reuse {flag}: cN / c1 = {med[f'cN-{flag}'] / med[f'c1-{flag}']:.2f}x")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    for b in backends.values():
        await b.aclose()


if __name__ == "__main__":
    asyncio.run(main())
