"""scripts/gpu_check.sh in its CPU mode, as a machine without the project's install runs
it (askspec from the script's link tree, the in-process character-level tokenizer): the
local trainer's two steps and the hf backend's batched generation run, the OpenRLHF job
is skipped with its reason, and the times are printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (askspec processes, a Ray cluster or a real model)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def run_check(**env: str) -> subprocess.CompletedProcess:
    # PYTHON: this interpreter (it has torch), whether or not the checkout has a .venv
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_cpu_mode_runs_the_trainer_and_generation_and_says_what_it_skipped() -> None:
    done = run_check(GPU_CHECK_DEVICE="cpu", GPU_CHECK_TOKENIZER="char", GPU_CHECK_LINK_TREE="1")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "askspec from a link tree of this checkout" in out
    assert re.search(r"askspec from /\S+/askspec\b", out) and "device cpu" in out
    assert "tokenizer: character-level, built in-process" in out
    trainer = re.search(r"^\[ran\] local trainer, 2 steps: on cpu: step 1 ([\d.]+) s.*step 2 ([\d.]+) s", out, re.M)
    assert trainer, out
    assert re.search(r"^\[ran\] hf batched generation: on cpu: 8 concurrent requests .* [1-9]\d* tokens in [\d.]+ s",
                     out, re.M), out
    # on a CPU the job needs a GPU (and here vLLM and Ray are not installed either)
    assert re.search(r"^\[skipped\] OpenRLHF job of specs/arith\.ask, 1 step: \S", out, re.M), out
    assert out.rstrip().splitlines()[-1].startswith("gpu_check: passed;")


def test_asking_for_cuda_without_one_is_an_error_not_a_silent_cpu_run() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = run_check(GPU_CHECK_DEVICE="cuda")
    assert done.returncode == 2 and "torch sees no CUDA device" in done.stderr and "[ran]" not in done.stdout
