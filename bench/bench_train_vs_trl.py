"""GRPO iterations side by side: askspec's local trainer against TRL 1.16's GRPOTrainer,
same machine, same run, same model (SmolLM2-135M-Instruct, float32, CPU), same prompts
(specs/data/arith_train.jsonl), group size, completion length and batch.

    .venv/bin/python bench/bench_train_vs_trl.py [--rounds 2] [--iterations 3] [--group 4] [--batch 8] [--max-new 32]

An iteration = generate a batch of completions (`batch` = prompts × group), score them
(the same reward: 0.5 for a boxed answer + 0.5 for the right one + the reply's characters
/ 1000, so that no group's rewards are all equal and every step updates) and take one
optimizer step (AdamW, lr 1e-5, no KL).

Like with like: by default every completion is exactly `max_new` tokens on both sides
(end-of-sequence masked out of sampling: TRL's `min_new_tokens`, and the same mask on
askspec's sampler; both keep the unmasked log-probs), so both train on the same number
of completion tokens per iteration. `--natural-length` lets replies stop at
`<|im_end|>` instead (then the token counts differ, and only tokens/s compare).

The headline is iteration tokens/s (completion tokens / the iteration's wall time),
with generation and update tokens/s beside it, each the median over the timed iterations. Each system runs in a child process of
its own; `--rounds` pairs run one after the other, the order swapped each round (ABBA),
so both see the same background load; the ratio of each pair and their median are
reported. The first iteration of each run is a warm-up and is not counted. askspec's
figures come from its own `train_steps` records (seconds_play, seconds_update,
seconds) and `rollouts`; TRL's from timing its `_generate` and its optimizer steps
(callbacks), because TRL reports timings only to experiment loggers.

Kernels: on a CPU askspec runs float32 linear layers through oneDNN
(runtime/backends/cpu_linear.py); TRL runs torch's default GEMM (MKL), as it ships.
`--trl-linear onednn` gives TRL's model askspec's layers too, and `ASKSPEC_CPU_LINEAR=torch`
takes them from askspec: what remains is what askspec's trainer does differently.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mask_eos_in_sampling() -> None:
    """Fixed-length completions for askspec: the hf backend samples with every
    end-of-sequence id at -inf (what transformers' `min_new_tokens` does for TRL), while the
    log-probs it records are those of the unmasked logits (as TRL's training forward sees)."""
    from askspec.runtime.backends import hf, hf_ops

    sample_rows = hf_ops.sample_rows
    original = hf.HFBackend._sample

    def _sample(self, rows, logits):
        eos = sorted(self._eos)

        def masked(lg, *a, **k):
            lg = lg.clone()
            lg[:, eos] = float("-inf")
            return sample_rows(lg, *a, **k)

        hf_ops.sample_rows = masked
        try:
            return original(self, rows, logits)
        finally:
            hf_ops.sample_rows = sample_rows

    hf.HFBackend._sample = _sample


LENGTH_REWARD = 1000  # reward += characters of the reply / this


def arith_spec(folder: Path) -> Path:
    """specs/arith.ask with its prompt and data, plus the length reward (see run_trl's
    `reward`): every group's rewards then differ, so every step of both systems updates
    (askspec skips the forward and backward pass of a step whose advantages are all 0,
    TRL runs it; equal rewards are common with fixed-length completions)."""
    for rel in ("prompts/arith/solve.j2", "data/arith_train.jsonl"):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes((ROOT / "specs" / rel).read_bytes())
    text = (ROOT / "specs" / "arith.ask").read_text()
    anchor = "    reward solver as answer = case { correct -> 0.5; else -> 0.0 }\n"
    assert anchor in text, "specs/arith.ask changed: update bench_train_vs_trl.py's arith_spec"
    spec = folder / "arith.ask"
    spec.write_text(text.replace(anchor, anchor + f"    reward solver as length = len(s.text) / {LENGTH_REWARD}\n"))
    return spec


def run_askspec(args, out: Path) -> dict:
    from askspec.cli import main as cli_main
    from askspec.runtime.store.views import open_store

    if not args.natural_length:
        _mask_eos_in_sampling()
    sets = [f"steps={args.iterations + 1}", f"group_size={args.group}", f"batch={args.batch}",
            f"max_new={args.max_new}", "lr=0.00001"]
    argv = ["run", str(arith_spec(out / "spec")), "--out", str(out / "runs"), "--quiet",
            *[x for s in sets for x in ("--set", s)]]
    t0 = time.time()
    if cli_main(argv) != 0:
        raise SystemExit("askspec run failed")
    run_dir = next(p for p in (out / "runs").iterdir() if p.is_dir())
    con = open_store(run_dir)
    skipped = con.execute("SELECT step, skipped FROM train_steps WHERE skipped IS NOT NULL").fetchall()
    if skipped:  # a skipped update would time no update at all
        raise SystemExit(f"askspec skipped updates {skipped}: the comparison needs every step to update")
    rows = con.execute("SELECT step, metrics->>'$.seconds_play', metrics->>'$.seconds_update', seconds FROM train_steps "
                       "ORDER BY step").fetchall()
    toks = dict(con.execute("SELECT step, sum(len(completion_ids)) FROM rollouts GROUP BY step").fetchall())
    # on-policy: the sampler played the trained weights (ratio 1, nothing clipped, the KL float noise)
    kl, clip = con.execute("SELECT max(mismatch_kl), max(clip_frac) FROM train_steps").fetchone()
    its = [{"gen_s": float(p), "update_s": float(u), "total_s": float(s), "tokens": int(toks[k])}
           for k, p, u, s in rows[1:]]
    import torch

    return {"iterations": its, "wall_s": time.time() - t0, "threads": [torch.get_num_threads()],
            "mismatch_kl_max": kl, "clip_frac_max": clip}


def run_trl(args, workdir: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from askspec.runtime.backends.hf import default_threads, resolve_weights
    from askspec.runtime.replies.verify import equiv

    torch.set_num_threads(default_threads())  # what `askspec run` sets (commands/resolver.py)
    folder = resolve_weights("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(folder))
    # the GGUF-converted tokenizer says <|im_start|> is EOS and has no pad (DESIGN.md): fix both
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    if args.trl_linear == "onednn":  # what askspec does on a CPU (cpu_linear), given to TRL's model too
        from askspec.runtime.backends.cpu_linear import use_onednn_linears

        use_onednn_linears(model)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    template = (ROOT / "specs" / "prompts" / "arith" / "solve.j2").read_text().strip()
    items = [json.loads(line) for line in (ROOT / "specs" / "data" / "arith_train.jsonl").read_text().splitlines()]
    n_prompts = args.batch // args.group * (args.iterations + 1)
    data = [{"prompt": [{"role": "user", "content": template.replace("{{ item.question }}", it["question"])}],
             "answer": it["answer"]} for it in items[:n_prompts]]

    def reward(completions, answer, **kw):
        from askspec.runtime.replies.parsers import last_boxed

        out = []
        for c, a in zip(completions, answer):
            text = c[0]["content"] if isinstance(c, list) else c
            b = last_boxed(text) or ""
            out.append((0.5 if b else 0.0) + (0.5 if b and equiv(b, a) else 0.0) + len(text) / LENGTH_REWARD)
        return out

    generation_kwargs = None if args.natural_length else {"min_new_tokens": args.max_new}
    config = GRPOConfig(output_dir=str(workdir), per_device_train_batch_size=args.batch, num_generations=args.group,
                        max_completion_length=args.max_new, max_steps=args.iterations + 1, learning_rate=1e-5,
                        use_cpu=True, bf16=False, beta=0.0, loss_type="grpo", temperature=1.0, logging_steps=1,
                        report_to=[], save_strategy="no", shuffle_dataset=False, seed=0, dataloader_num_workers=0,
                        generation_kwargs=generation_kwargs)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_list(data),
                          processing_class=tok)
    gen_times: list[float] = []
    gen_tokens: list[int] = []
    original = trainer._generate

    def timed_generate(prompts):
        t = time.perf_counter()
        result = original(prompts)
        gen_times.append(time.perf_counter() - t)
        gen_tokens.append(sum(len(ids) for ids in result[1]))
        return result

    trainer._generate = timed_generate
    step_times: list[float] = []
    threads: set[int] = set()  # torch's CPU threads while training (the same as askspec's)

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            step_times.append(time.perf_counter() - self.t)
            threads.add(torch.get_num_threads())

    trainer.add_callback(Clock())
    t0 = time.time()
    trainer.train()
    its = [{"gen_s": g, "update_s": s - g, "total_s": s, "tokens": n}
           for g, s, n in zip(gen_times[1:], step_times[1:], gen_tokens[1:])]
    return {"iterations": its, "wall_s": time.time() - t0, "threads": sorted(threads)}


def summary(name: str, res: dict) -> dict:
    """Medians over the timed iterations (one iteration slowed by a neighbour's burst of work
    moves a median less than a sum)."""
    its = res["iterations"]

    def rate(key: str) -> float:
        return statistics.median(i["tokens"] / i[key] for i in its)

    return {"system": name, "iteration_s": statistics.median(i["total_s"] for i in its),
            "iteration_tok_s": rate("total_s"), "gen_tok_s": rate("gen_s"), "update_tok_s": rate("update_s"),
            "tokens_per_iteration": statistics.median(i["tokens"] for i in its), "threads": res["threads"],
            "iterations": its}


def child(side: str, args: argparse.Namespace) -> dict:
    """Run one system in a fresh process (its own imports, threads and allocator)."""
    flags = [f"--iterations={args.iterations}", f"--group={args.group}", f"--batch={args.batch}",
             f"--max-new={args.max_new}", f"--trl-linear={args.trl_linear}",
             *(["--natural-length"] if args.natural_length else [])]
    load0 = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, __file__, "--side", side, *flags], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["load"] = (load0, os.getloadavg()[0])
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs (askspec, TRL), order swapped each round")
    ap.add_argument("--iterations", type=int, default=3, help="timed iterations per run (after one warm-up)")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--natural-length", action="store_true",
                    help="let completions stop at end-of-sequence (token counts then differ between the systems)")
    ap.add_argument("--trl-linear", choices=("torch", "onednn"), default="torch",
                    help="TRL's float32 linear layers: torch's GEMM as TRL ships (default), or askspec's oneDNN "
                         "layers (runtime/backends/cpu_linear.py), to see what askspec gains besides the kernel")
    ap.add_argument("--side", choices=("askspec", "trl"), help=argparse.SUPPRESS)  # a child's one system
    args = ap.parse_args()
    if args.side:
        with tempfile.TemporaryDirectory() as tmp:
            res = run_askspec(args, Path(tmp)) if args.side == "askspec" else run_trl(args, Path(tmp))
        print(json.dumps(res))
        return 0
    pairs = []
    for r in range(args.rounds):
        order = ("askspec", "trl") if r % 2 == 0 else ("trl", "askspec")
        got = {side: child(side, args) for side in order}
        trl_name = "TRL 1.16 GRPOTrainer" + (" (oneDNN linears)" if args.trl_linear == "onednn" else "")
        ours, theirs = summary("askspec", got["askspec"]), summary(trl_name, got["trl"])
        pairs.append((ours, theirs, got["askspec"]["load"], got["trl"]["load"]))
        print(f"round {r + 1} ({' then '.join(order)}): askspec {ours['iteration_tok_s']:.1f} tok/s "
              f"({ours['tokens_per_iteration']:.0f} tok/it, load {got['askspec']['load'][0]:.1f}), "
              f"TRL {theirs['iteration_tok_s']:.1f} tok/s ({theirs['tokens_per_iteration']:.0f} tok/it, "
              f"load {got['trl']['load'][0]:.1f}): {ours['iteration_tok_s'] / theirs['iteration_tok_s']:.2f}x "
              f"(torch threads {ours['threads']} / {theirs['threads']}); askspec on-policy: mismatch KL max "
              f"{got['askspec'].get('mismatch_kl_max')}, clip max {got['askspec'].get('clip_frac_max')}",
              file=sys.stderr, flush=True)
    print(json.dumps([{"askspec": o, "trl": t, "load_askspec": la, "load_trl": lt} for o, t, la, lt in pairs], indent=1))
    print("\n| round | system | iteration (median) | iteration tok/s | generation tok/s | update tok/s | "
          "completion tokens / iteration | load (start, end) |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r, (ours, theirs, la, lt) in enumerate(pairs, 1):
        for res, load in ((ours, la), (theirs, lt)):
            print(f"| {r} | {res['system']} | {res['iteration_s']:.2f} s | {res['iteration_tok_s']:.1f} | "
                  f"{res['gen_tok_s']:.1f} | {res['update_tok_s']:.1f} | {res['tokens_per_iteration']:.0f} | "
                  f"{load[0]:.1f}, {load[1]:.1f} |")
    ratios = [o["iteration_tok_s"] / t["iteration_tok_s"] for o, t, _, _ in pairs]
    gen = [o["gen_tok_s"] / t["gen_tok_s"] for o, t, _, _ in pairs]
    upd = [o["update_tok_s"] / t["update_tok_s"] for o, t, _, _ in pairs]
    print(f"\niteration tokens/s, askspec / TRL: {statistics.median(ratios):.2f}x (median of "
          f"{', '.join(f'{x:.2f}' for x in ratios)}); generation {statistics.median(gen):.2f}x, "
          f"update {statistics.median(upd):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
