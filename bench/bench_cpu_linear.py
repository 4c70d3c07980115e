"""float32 linear layers on a CPU: torch's default GEMM (MKL's sgemm) against oneDNN
(runtime/backends/cpu_linear.py), side by side in one process.

    .venv/bin/python bench/bench_cpu_linear.py [--rounds 3] [--threads N]

On SmolLM2-135M-Instruct (float32, as the hf backend serves it and the local trainer trains
it), interleaved round after round (each measurement runs with both kernels back to back,
the order swapped every round, so a change in the machine's load hits both), medians over
the rounds:

- GEMM: each of the model's linear shapes at 8 rows (a decode step), 94 (one prompt's
  prefill) and 378 (the update below), forward, and the backward's two products
  (dx = dy W, dW = dy^T x), in GFLOP/s;
- decode: one step of 8 rows over a 94-token cache (what generation repeats per token);
- prefill: one 94-token prompt (logits of its last position only);
- update: the local trainer's forward and backward (`TrainedPolicy.token_logprobs` and a
  policy-gradient loss) of 2 prompts x 4 replies x 32 tokens, the batch of
  bench_train_vs_trl.py, and AdamW's step.

The two paths' outputs are compared too (max relative difference of the logits and
of the gradients): both are IEEE float32, only the summation order differs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch


def _timed(fn: Callable[[], Any], reps: int) -> float:
    fn()  # warm: oneDNN builds a primitive per shape on first use
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def _policy() -> Any:
    from askspec.ir import model as ir
    from askspec.lang.training import lower_training
    from askspec.runtime.train.config import config_from_ir
    from askspec.runtime.train.policy import TrainedPolicy

    exp = lower_training(ir.Experiment(name="bench", roles=[ir.Role(name="r", trained=True)],
                                       training=[ir.Training(role="r", algorithm="grpo")]), {"r": {"lr": 1e-5}})
    return TrainedPolicy(config_from_ir(exp.training[0], exp), "smollm2-135m-instruct")


def _turns(vocab: int) -> list[Any]:
    from askspec.runtime.train.batch import Turn

    gen = torch.Generator().manual_seed(0)
    turns = []
    for p in range(2):
        prompt = torch.randint(10, vocab, (62,), generator=gen).tolist()
        for r in range(4):
            completion = torch.randint(10, vocab, (32,), generator=gen).tolist()
            turns.append(Turn(f"s{p}{r}", 1, 0, prompt, completion, [-1.0] * 32, 1.0, "length"))
    return turns


def main() -> int:
    from askspec.runtime.backends.cpu_linear import available, use_onednn_linears, use_torch_linears
    from askspec.runtime.backends.hf import default_threads
    from askspec.runtime.backends.hf_ops import new_cache

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=default_threads(), help="torch threads (default: askspec run's)")
    args = ap.parse_args()
    if not available():
        raise SystemExit("this torch has no oneDNN linear (or ASKSPEC_CPU_LINEAR=torch is set)")
    torch.set_num_threads(args.threads)

    policy = _policy()
    model = policy.model
    vocab = model.config.vocab_size
    turns = _turns(vocab)
    gen = torch.Generator().manual_seed(1)
    context = torch.randint(10, vocab, (8, 94), generator=gen)
    prompt = context[:1]
    cache_state: dict[str, Any] = {}

    def fill_cache() -> None:
        cache = new_cache()
        with torch.inference_mode():
            model(input_ids=context, attention_mask=torch.ones_like(context), past_key_values=cache,
                  use_cache=True, logits_to_keep=1)
        cache_state["cache"] = cache

    def decode() -> None:
        cache = cache_state["cache"]
        with torch.inference_mode():
            model(input_ids=context[:, -1:], attention_mask=torch.ones((8, 95), dtype=torch.long),
                  position_ids=torch.full((8, 1), 94), past_key_values=cache, use_cache=True)
        for layer in cache.layers:  # back to 94 tokens: every step sees the same context
            layer.assign(layer.keys[:, :, :94], layer.values[:, :, :94])

    def prefill() -> None:
        with torch.inference_mode():
            model(input_ids=prompt, attention_mask=torch.ones_like(prompt), past_key_values=new_cache(),
                  use_cache=True, logits_to_keep=1)

    def update() -> None:
        policy.optimizer.zero_grad(set_to_none=True)
        logp, mask = policy.token_logprobs(model, turns)
        (-(logp * mask).sum() / mask.sum()).backward()
        policy.optimizer.step()

    params = policy.params
    start = [p.detach().clone() for p in params]

    def restore() -> None:  # every update starts from the same weights and fresh AdamW moments
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        policy.optimizer.state.clear()

    shapes = sorted({(m.out_features, m.in_features) for m in model.modules() if isinstance(m, torch.nn.Linear)})
    sides = {"torch (MKL)": use_torch_linears, "oneDNN": use_onednn_linears}
    times: dict[str, dict[str, list[float]]] = {name: {} for name in sides}

    def record(side: str, key: str, seconds: float) -> None:
        times[side].setdefault(key, []).append(seconds)

    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            sides[side](model)
            for n_out, n_in in shapes:
                w = torch.randn(n_out, n_in)
                layer = torch.nn.Linear(n_in, n_out, bias=False)
                with torch.no_grad():
                    layer.weight.copy_(w)
                if side == "oneDNN":
                    use_onednn_linears(layer)
                for rows in (8, 94, 378):
                    x = torch.randn(rows, n_in, requires_grad=True)
                    reps = max(2, int(2e8 / (rows * n_out * n_in)))
                    with torch.no_grad():
                        record(side, f"gemm fwd {n_out}x{n_in} @ {rows} rows", _timed(lambda: layer(x), reps))
                    y = layer(x)
                    g = torch.randn_like(y)
                    record(side, f"gemm fwd+bwd {n_out}x{n_in} @ {rows} rows",
                           _timed(lambda: torch.autograd.grad(layer(x), (x, layer.weight), g), reps))
            fill_cache()
            record(side, "decode step, 8 rows, 94-token cache", _timed(decode, 10))
            record(side, "prefill, one 94-token prompt", _timed(prefill, 5))
            restore()
            record(side, "update: forward + backward + AdamW, 2 x 4 x (62 + 32) tokens", _timed(lambda: (restore(), update()), 2))

    # the two paths' numbers: logits and gradients of one update batch
    outs = {}
    for side, switch in sides.items():
        switch(model)
        restore()
        policy.optimizer.zero_grad(set_to_none=True)
        logp, mask = policy.token_logprobs(model, turns)
        (-(logp * mask).sum() / mask.sum()).backward()
        outs[side] = (logp.detach(), torch.cat([p.grad.flatten() for p in params]))
    (la, ga), (lb, gb) = outs.values()
    rel_logp = float(((la - lb).abs() / la.abs().clamp(min=1e-6)).max())
    rel_grad = float((ga - gb).norm() / ga.norm())

    print(f"SmolLM2-135M float32, {torch.get_num_threads()} torch thread(s), {args.rounds} interleaved rounds "
          f"(medians)\n")
    print("| measurement | torch (MKL) | oneDNN | speed-up |")
    print("|---|---:|---:|---:|")
    for key in times["oneDNN"]:
        a, b = statistics.median(times["torch (MKL)"][key]), statistics.median(times["oneDNN"][key])
        if key.startswith("gemm"):
            n_out, n_in, rows = (int(v) for v in key.split()[2].split("x") + [key.split()[4]])
            flops = 2 * rows * n_out * n_in * (3 if "bwd" in key else 1)
            print(f"| {key} | {flops / a / 1e9:.0f} GFLOP/s | {flops / b / 1e9:.0f} GFLOP/s | {a / b:.2f}x |")
        else:
            print(f"| {key} | {a * 1e3:.1f} ms | {b * 1e3:.1f} ms | {a / b:.2f}x |")
    print(f"\nlog-probs of the update batch: max relative difference {rel_logp:.1e}; "
          f"gradient: relative difference of the whole vector {rel_grad:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
