"""hf backend on CPU: attention kernel and torch thread count, prefill and decode, side by side.

    python bench/bench_hf_kernels.py [--prompt 500] [--batch 8] [--context 600] [--reps 3]
                                     [--threads 1,2] [--attn askspec_gqa_sdpa,sdpa,eager]

Times the two forward passes the backend runs: a prefill of one `--prompt`-token prompt
(logits for the last position only) and a decode step of `--batch` rows over a
`--context`-token cache, for each attention implementation and thread count, interleaved
round after round (so a change in machine load hits all of them); medians over `--reps`
rounds. The model is SmolLM2-135M-Instruct in float32, as the backend serves it on CPU
(`--quantize int8` / `fp16`: with the backend's weight-only int8 or float16 linears).

`--prefill-batch N` instead compares prefilling N prompts of `--prompt` tokens (varied
lengths, left-padded as the backend does) in one forward pass against one pass each, with
the backend's kernel and thread count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=500)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=600)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--attn", default="askspec_gqa_sdpa,sdpa,eager")
    ap.add_argument("--prefill-batch", type=int, default=0)
    ap.add_argument("--quantize", choices=("none", "int8", "fp16"), default="none",
                    help="the backend's quantize setting (default none: float32)")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from askspec.runtime.backends.hf import resolve_weights
    from askspec.runtime.backends.hf_ops import new_cache, use_gqa_attention

    folder = resolve_weights("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    if args.quantize != "none":
        from askspec.runtime.backends.hf_quant import quantize_linears

        model = quantize_linears(model, args.quantize, torch.device("cpu"))
    use_gqa_attention(model)  # registers the askspec kernel name
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, args.prompt), generator=gen)
    context = torch.randint(0, vocab, (args.batch, args.context), generator=gen)

    def prefill() -> None:
        model(input_ids=prompt, attention_mask=torch.ones_like(prompt), use_cache=True,
              past_key_values=new_cache(), logits_to_keep=1)

    def decode_cache():
        cache = new_cache()
        mask = torch.ones_like(context)
        model(input_ids=context, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache, mask

    if args.prefill_batch:
        _prefill_batch(model, args, vocab, gen)
        return

    caches = {}
    threads = [int(t) for t in args.threads.split(",")]
    attns = [a.strip() for a in args.attn.split(",")]
    combos = [(a, t) for a in attns for t in threads]
    times: dict[tuple[str, int], dict[str, list[float]]] = {c: {"prefill": [], "decode": []} for c in combos}
    print(f"load average {os.getloadavg()[0]:.1f} at start; {os.cpu_count()} CPUs; torch {torch.__version__}")
    with torch.inference_mode():
        for rep in range(args.reps):
            for attn, nthreads in (combos if rep % 2 == 0 else list(reversed(combos))):
                torch.set_num_threads(nthreads)
                model.set_attn_implementation(attn)
                t = time.perf_counter()
                prefill()
                times[(attn, nthreads)]["prefill"].append(time.perf_counter() - t)
                if attn not in caches:
                    caches[attn] = decode_cache()
                cache, mask = caches[attn]
                step_mask = torch.cat([mask, mask.new_ones((args.batch, 1))], dim=1)
                ids = torch.randint(0, vocab, (args.batch, 1), generator=gen)
                pos = torch.full((args.batch, 1), args.context)
                t = time.perf_counter()
                model(input_ids=ids, attention_mask=step_mask, position_ids=pos, past_key_values=cache, use_cache=True)
                times[(attn, nthreads)]["decode"].append(time.perf_counter() - t)
                for layer in cache.layers:  # drop the column again so every step sees the same context
                    layer.assign(layer.keys[:, :, : args.context], layer.values[:, :, : args.context])
    print(f"\n| attention | threads | prefill {args.prompt} tokens, ms | decode step, batch {args.batch} "
          f"at {args.context}, ms |")
    print("|---|---:|---:|---:|")
    for (attn, nthreads), t in times.items():
        print(f"| {attn} | {nthreads} | {statistics.median(t['prefill']) * 1000:.0f} | "
              f"{statistics.median(t['decode']) * 1000:.0f} |")
    print(f"load average {os.getloadavg()[0]:.1f} at end")


def _prefill_batch(model, args, vocab: int, gen: torch.Generator) -> None:
    from askspec.runtime.backends.hf import default_threads
    from askspec.runtime.backends.hf_ops import new_cache

    torch.set_num_threads(default_threads())
    lengths = [args.prompt - 15 * i for i in range(args.prefill_batch)]
    prompts = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
    width = max(lengths)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = p
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    times: dict[str, list[float]] = {"one pass": [], "one pass each": []}
    print(f"load average {os.getloadavg()[0]:.1f} at start; {torch.get_num_threads()} thread(s)")
    with torch.inference_mode():
        for rep in range(args.reps):
            for mode in (("one pass", "one pass each") if rep % 2 == 0 else ("one pass each", "one pass")):
                t = time.perf_counter()
                if mode == "one pass":
                    model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=new_cache(),
                          use_cache=True, logits_to_keep=1)
                else:
                    for p in prompts:
                        model(input_ids=p[None], attention_mask=torch.ones_like(p[None]), past_key_values=new_cache(),
                              use_cache=True, logits_to_keep=1)
                times[mode].append(time.perf_counter() - t)
    total = sum(lengths)
    print(f"\n| prefill of {len(prompts)} prompts ({min(lengths)}-{max(lengths)} tokens, {total} in all) | s | "
          f"prompt tok/s |")
    print("|---|---:|---:|")
    for mode, t in times.items():
        med = statistics.median(t)
        print(f"| {mode} | {med:.2f} | {total / med:.0f} |")
    print(f"load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
