"""One GRPO iteration side by side: askspec's local trainer against TRL 1.16's GRPOTrainer,
same machine, same run, same model (SmolLM2-135M-Instruct, float32, CPU), same prompts
(specs/data/arith_train.jsonl), group size, completion length and batch.

    .venv/bin/python bench/bench_train_vs_trl.py [--iterations 3] [--group 4] [--batch 8] [--max-new 32]

An iteration = generate a batch of completions (`batch` = prompts × group), score them
(the same reward: 0.5 for a boxed answer + 0.5 for the right one) and take one optimizer
step (AdamW, lr 1e-5, no KL). Reported per system: the median iteration's wall time,
generation tokens/s (completion tokens / generation seconds) and update tokens/s
(completion tokens / the rest of the iteration). The first iteration of each is a
warm-up and is not counted. askspec's figures come from its own `train_steps` records
(seconds_play, seconds_update) and `rollouts`; TRL's from timing its `_generate` and its
optimizer steps (callbacks), because TRL reports timings only to experiment loggers.
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


def run_askspec(args, out: Path) -> dict:
    from askspec.runtime.store.views import open_store

    sets = [f"steps={args.iterations + 1}", f"group_size={args.group}", f"batch={args.batch}",
            f"max_new={args.max_new}", "lr=0.00001"]
    cmd = [sys.executable, "-m", "askspec.cli", "run", str(ROOT / "specs" / "arith.ask"), "--out", str(out), "--quiet",
           *[x for s in sets for x in ("--set", s)]]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    run_dir = proc.stdout.strip().splitlines()[-1]
    con = open_store(run_dir)
    rows = con.execute("SELECT step, metrics->>'$.seconds_play', metrics->>'$.seconds_update', seconds FROM train_steps "
                       "ORDER BY step").fetchall()
    toks = dict(con.execute("SELECT step, sum(len(completion_ids)) FROM rollouts GROUP BY step").fetchall())
    its = [{"gen_s": float(p), "update_s": float(u), "total_s": float(s), "tokens": int(toks[k])}
           for k, p, u, s in rows[1:]]
    return {"iterations": its, "wall_s": time.time() - t0}


def run_trl(args, workdir: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from askspec.runtime.backends.hf import default_threads, resolve_weights
    from askspec.runtime.replies.verify import equiv

    torch.set_num_threads(default_threads())
    folder = resolve_weights("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(folder))
    # the GGUF-converted tokenizer says <|im_start|> is EOS and has no pad (DESIGN.md): fix both
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
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
            out.append((0.5 if b else 0.0) + (0.5 if b and equiv(b, a) else 0.0))
        return out

    config = GRPOConfig(output_dir=str(workdir), per_device_train_batch_size=args.batch, num_generations=args.group,
                        max_completion_length=args.max_new, max_steps=args.iterations + 1, learning_rate=1e-5,
                        use_cpu=True, bf16=False, beta=0.0, loss_type="grpo", temperature=1.0, logging_steps=1,
                        report_to=[], save_strategy="no", shuffle_dataset=False, seed=0, dataloader_num_workers=0)
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

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            step_times.append(time.perf_counter() - self.t)

    trainer.add_callback(Clock())
    t0 = time.time()
    trainer.train()
    its = [{"gen_s": g, "update_s": s - g, "total_s": s, "tokens": n}
           for g, s, n in zip(gen_times[1:], step_times[1:], gen_tokens[1:])]
    return {"iterations": its, "wall_s": time.time() - t0}


def summary(name: str, res: dict) -> dict:
    its = res["iterations"]
    total = statistics.median(i["total_s"] for i in its)
    gen = sum(i["tokens"] for i in its) / sum(i["gen_s"] for i in its)
    upd = sum(i["tokens"] for i in its) / sum(i["update_s"] for i in its)
    return {"system": name, "iteration_s": total, "gen_tok_s": gen, "update_tok_s": upd,
            "tokens_per_iteration": statistics.median(i["tokens"] for i in its)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=3, help="timed iterations (after one warm-up)")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ours = summary("askspec", run_askspec(args, Path(tmp) / "askspec"))
        theirs = summary("TRL 1.16 GRPOTrainer", run_trl(args, Path(tmp) / "trl"))
    print(json.dumps([ours, theirs], indent=2))
    print(f"\n| system | iteration (median) | generation tok/s | update tok/s | completion tokens / iteration |")
    print("|---|---|---|---|---|")
    for r in (ours, theirs):
        print(f"| {r['system']} | {r['iteration_s']:.1f} s | {r['gen_tok_s']:.1f} | {r['update_tok_s']:.1f} | "
              f"{r['tokens_per_iteration']:.0f} |")
    print(f"\nspeed-up per iteration: {theirs['iteration_s'] / ours['iteration_s']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
