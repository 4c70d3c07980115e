"""`--resume` over a damaged checkpoint (issue #25, item 8): the refusal names the file and
offers the newest intact earlier checkpoint with the commands to continue from it, and no
"internal error" reaches the user; after those commands the run resumes from that step.
On the suite's tiny random Llama (tests/conftest.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (askspec processes, a Ray cluster or a real model)

ROOT = Path(__file__).resolve().parents[2]

SPEC = """model m = hf("{model}") {{ max_tokens = 3; temperature = 1.0 }}
role a {{ model = m; memory = none; prompt = "a + b"; trained }}
game g for i in range(0, 8) {{
    x = ask a
    reward a = len(x.text)
}}
train a with grpo {{ group = 2; steps = 3; save_every = 1; keep_checkpoints = 3; lr = 0.01 }}
"""


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "askspec.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def finished_run(tiny_model, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("damaged")
    spec = base / "t.ask"
    spec.write_text(SPEC.format(model=tiny_model))
    proc = cli("run", str(spec), "--out", str(base / "runs"))
    assert proc.returncode == 0, proc.stderr
    (run,) = [d for d in (base / "runs").iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert sorted(p.name for p in (run / "checkpoints" / "a").iterdir()) == ["step-1", "step-2", "step-3"]
    return run


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    """A copy of the run as a kill after its last checkpoint leaves it (a finished run has
    nothing to resume: `--resume` says so and loads nothing)."""
    copy = tmp_path / finished_run.name
    shutil.copytree(finished_run, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.update(status="interrupted", ended_at=None)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_damaged_checkpoint_is_named_and_an_intact_one_offered(run):
    weights = run / "checkpoints" / "a" / "step-3" / "model.safetensors"
    truncate(weights)
    proc = cli("run", "--resume", str(run))
    assert proc.returncode == 1
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert f"checkpoint step 3 cannot be resumed from: {weights} is damaged (SafetensorError" in proc.stderr
    assert "Checkpoint step 2 is intact" in proc.stderr
    moved = run / "checkpoints" / "a" / "damaged-step-3"
    assert f"mv {weights.parent} {moved}; askspec run --resume {run}" in proc.stderr
    # as offered: move it aside and resume; steps 3 is played again from step 2's weights
    weights.parent.rename(moved)
    proc = cli("run", "--resume", str(run))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 3
    state = json.loads((run / "checkpoints" / "a" / "step-3" / "trainer_state.json").read_text())
    assert state["version"] == 3  # three optimizer steps in all


def test_no_intact_checkpoint_says_start_again(run):
    for n in (1, 2, 3):
        truncate(run / "checkpoints" / "a" / f"step-{n}" / "model.safetensors")
    (run / "checkpoints" / "a" / "step-2" / "config.json").write_text("{")
    proc = cli("run", "--resume", str(run))
    assert proc.returncode == 1 and "internal error" not in proc.stderr
    assert "No earlier checkpoint can be resumed from: start the run again" in proc.stderr


def test_a_damaged_latest_json_is_named(run):
    latest = run / "checkpoints" / "latest.json"
    latest.write_text('{"step": ')
    proc = cli("run", "--resume", str(run))
    assert proc.returncode == 1 and "internal error" not in proc.stderr
    assert f"{latest} cannot be read (JSONDecodeError" in proc.stderr
