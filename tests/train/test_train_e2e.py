"""`askspec run` trains a spec with a `train` block end to end on CPU (real SmolLM2, tiny
settings), and survives `kill -9` + `--resume` with every step exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.runtime.store.views import open_store

SPEC = Path(__file__).parent / "specs" / "tiny_train.ask"
pytestmark = pytest.mark.slow


def askspec(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "askspec.cli", *args], capture_output=True, text=True, timeout=900,
                          **kw)


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, e2e) -> Path:
    """A training run killed with SIGKILL after its first checkpoint, then resumed."""
    out = tmp_path_factory.mktemp("train") / "runs"
    # mid-run: step 1 is checkpointed, step 2 is being played
    e2e.kill_run_when(e2e.cmd("run", str(SPEC), "--out", str(out), "--quiet"), out,
                      lambda o: s if (s := e2e.latest_step(o)) is not None and s >= 1 else None, 600)
    run_dir = e2e.only_run(out)
    e2e.resume(run_dir)
    return run_dir


def test_kill_9_then_resume_trains_every_step_exactly_once(resumed_run):
    run_dir = resumed_run
    con = open_store(run_dir)
    steps = con.execute("SELECT role, step, loss, reward_mean, lr, tokens, grad_norm FROM train_steps ORDER BY step").fetchall()
    assert [(r, s) for r, s, *_ in steps] == [("solver", 1), ("solver", 2), ("solver", 3)]
    assert all(row[3] is not None and row[5] > 0 and row[6] is not None for row in steps)
    # every optimizer step exactly once: the final weights have seen 3 updates
    state = json.loads((run_dir / "checkpoints" / "solver" / "step-3" / "trainer_state.json").read_text())
    assert state["version"] == 3 and state["step"] == 3
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"] == 3
    assert not (run_dir / "checkpoints" / "solver" / "step-1").exists()  # keep_checkpoints = 1
    # 2 sessions per step, each step's sessions once in the views
    assert con.execute("SELECT count(*), count(DISTINCT session_id) FROM sessions WHERE status = 'ok'").fetchone() == (6, 6)
    rows = con.execute("SELECT step, session_id, len(completion_ids), len(logprobs), trajectory FROM rollouts ORDER BY step").fetchall()
    assert sorted({r[0] for r in rows}) == [1, 2, 3] and len(rows) == 6
    assert all(n == m and n > 0 and traj for _, _, n, m, traj in rows)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["resumes"] == 1
    # metrics compare steps
    from askspec.runtime.engine.metrics import run_metrics

    rows, errors = run_metrics(str(run_dir))
    assert [(r["metric"], r["by"], r["n"]) for r in rows] == [("mean_reward", {"step": k}, 2) for k in (1, 2, 3)]


def test_eval_only_plays_without_training_and_a_checkpoint_is_a_model(resumed_run, tmp_path, e2e):
    out = tmp_path / "runs"
    ckpt = resumed_run / "checkpoints" / "solver" / "step-3"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "config.json").exists()
    # a model declaration can point at the run's checkpoint
    spec = tmp_path / "eval.ask"
    spec.write_text(SPEC.read_text().replace('hf("smollm2-135m-instruct")', f'hf("{ckpt}")'))
    ev = askspec("run", str(spec), "--out", str(out / "eval"), "--eval-only", "--quiet")
    assert ev.returncode == 0, ev.stderr
    eval_dir = e2e.only_run(out / "eval")
    con = open_store(eval_dir)
    assert con.execute("SELECT count(*) FROM train_steps").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM rollouts").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM sessions WHERE status = 'ok'").fetchone() == (4,)
    assert not (eval_dir / "checkpoints").exists()


def test_refusals_are_diagnostics_at_the_spec_line(tmp_path):
    spec = tmp_path / "alt.ask"
    spec.write_text(SPEC.read_text() + "\nschedule nested { outer = solver; inner = solver; outer_reward = intrinsic }\n")
    proc = askspec("run", str(spec), "--out", str(tmp_path / "runs"))
    assert proc.returncode == 1
    line = spec.read_text().splitlines().index("schedule nested { outer = solver; inner = solver; outer_reward = intrinsic }") + 1
    assert f"alt.ask:{line}:1: error[E405]: the nested schedule's outer and inner roles are both 'solver'" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = askspec("run", str(SPEC), "--out", str(tmp_path / "runs"), "--sessions", "2")
    assert proc.returncode == 1 and "--sessions is for --eval-only runs" in proc.stderr
    replay = tmp_path / "r.json"
    replay.write_text('{"sessions": [{"solver": ["\\\\boxed{3}"], "echo": ["ok"]}]}')
    proc = askspec("run", str(SPEC), "--out", str(tmp_path / "runs"), "--replay", str(replay))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "role 'solver' is trained but its model runs on the replay backend" in proc.stderr
