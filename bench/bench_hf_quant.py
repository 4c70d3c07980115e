"""The hf backend's `quantize` settings side by side: none (float32), int8 and fp16.

    python bench/bench_hf_quant.py [--reps 7] [--modes none,int8,fp16] [--threads 1]

Two parts, every mode measured in the same run, one thread (the backend's default on the
project's 2-core machine):

1. The linear layers alone: SmolLM2-135M's projection shapes (576x576, 576->1536,
   1536->576) at 1, 8, 64 and 512 rows: ms per call, and whether a row's output is the
   same bits alone as among 300 rows (row invariance: what lets a reply's cached
   keys/values, computed one decode step at a time, equal a re-encoding's).
2. The whole model (SmolLM2-135M-Instruct as the backend loads it): top-1 token
   agreement with float32 on a 300-token text, a 500-token prefill, and a decode step
   over a 600-token cache at batch 1 and 8 (medians; batch 8 / batch 1 is what batching
   costs per step: 8 rows for that much more time).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from typing import Any, Callable

SHAPES = ((576, 576), (1536, 576), (576, 1536))  # (out, in): q/o, gate/up, down
ROWS = (1, 8, 64, 512)
TEXT = ("The lighthouse on the northern cape was built in 1871 from granite quarried on the island. Its keepers "
        "carried paraffin up one hundred and twelve steps every evening, and logged the height of every winter wave "
        "against marks painted on the tower. ")


def median_time(fn: Callable[[], Any], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def layer_for(mode: str, linear: Any) -> Any:
    """`linear` as the backend serves it under `mode`."""
    import torch

    from askspec.runtime.backends.hf_quant import quantize_linears

    holder = torch.nn.Sequential(copy.deepcopy(linear))
    quantize_linears(holder, mode, torch.device("cpu"))
    return holder[0]


def linears(modes: list[str], reps: int) -> None:
    import torch

    print("linear layers: ms per call (row-invariant: a row alone gives the same bits as among 300)")
    print(f"{'shape (out x in)':18s} {'mode':6s} " + " ".join(f"{m:>9s}" for m in (f'{r} rows' for r in ROWS))
          + "  row-invariant")
    torch.manual_seed(0)
    for out_f, in_f in SHAPES:
        linear = torch.nn.Linear(in_f, out_f, bias=False)
        for mode in modes:
            layer = layer_for(mode, linear)
            cells = []
            with torch.inference_mode():
                for rows in ROWS:
                    x = torch.randn(rows, in_f)
                    cells.append(median_time(lambda: layer(x), reps) * 1e3)
                x = torch.randn(300, in_f)
                whole = layer(x)
                alone = torch.cat([layer(x[i:i + 1]) for i in range(300)])
            print(f"{f'{out_f} x {in_f}':18s} {mode:6s} " + " ".join(f"{c:9.3f}" for c in cells)
                  + f"  {'yes' if torch.equal(whole, alone) else 'no'}", flush=True)


def whole_model(modes: list[str], reps: int) -> None:
    import torch

    from askspec.runtime.backends.hf import HFBackend
    from askspec.runtime.backends.hf_ops import new_cache
    from askspec.runtime.backends.hf_quant import quantize_linears

    full = HFBackend("smollm2-135m-instruct", prefix_cache=False)
    full.load()
    base = full._model
    ids = torch.tensor([full._tokenizer(TEXT * 12)["input_ids"][:600]])
    print("\nwhole model (SmolLM2-135M-Instruct): medians, ms")
    print(f"{'mode':6s} {'top-1 = float32':>15s} {'prefill 500':>12s} {'step b1':>8s} {'step b8':>8s} {'b8 / b1':>8s}")
    with torch.inference_mode():
        reference = base(input_ids=ids[:, :300]).logits[0].argmax(-1)
        for mode in modes:
            model = base if mode == "none" else quantize_linears(copy.deepcopy(base), mode, torch.device("cpu"))
            agree = (model(input_ids=ids[:, :300]).logits[0].argmax(-1) == reference).float().mean().item()
            prefill = median_time(lambda: model(input_ids=ids[:, :500], logits_to_keep=1), max(3, reps // 2))
            step = {}
            for batch in (1, 8):
                cache = new_cache()
                model(input_ids=ids[:, :599].repeat(batch, 1), past_key_values=cache, use_cache=True, logits_to_keep=1)
                last = ids[:, 599:600].repeat(batch, 1)

                def one_step() -> None:
                    model(input_ids=last, past_key_values=cache, use_cache=True)
                    for layer in cache.layers:  # take the step's column back off: every step sees 600 tokens
                        n = layer.keys.shape[-2] - 1
                        layer.keys, layer.values = layer._kbuf[:, :, :n], layer._vbuf[:, :, :n]

                step[batch] = median_time(one_step, reps)
            print(f"{mode:6s} {agree:15.3f} {prefill * 1e3:12.0f} {step[1] * 1e3:8.1f} {step[8] * 1e3:8.1f} "
                  f"{step[8] / step[1]:8.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--modes", default="none,int8,fp16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-model", action="store_true", help="the linear layers only")
    args = ap.parse_args()
    import os

    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    linears(modes, args.reps)
    if not args.skip_model:
        whole_model(modes, args.reps)
    print(f"(load average at end: {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
