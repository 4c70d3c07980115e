"""`askspec run` trains a spec with a `train` block end to end on CPU (the suite's tiny
random Llama, tests/conftest.py: the test checks the steps, the resume and the checkpoints,
not learning), and survives `kill -9` + `--resume` with every step exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.runtime.store.views import open_store

SPEC = Path(__file__).parent / "specs" / "tiny_train.ask"
STEPS = 10  # the spec's
pytestmark = pytest.mark.slow


def askspec(capsys, *args: str) -> tuple[int, str]:
    """`askspec ARGS` in this process (refusals: no model is loaded): its exit status and stderr."""
    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, e2e, tiny_model) -> Path:
    """A training run (on the tiny model) killed with SIGKILL after its first checkpoint, then resumed."""
    text = SPEC.read_text()
    assert text.count('hf("smollm2-135m-instruct")') == 1 and f"steps = {STEPS};" in text
    spec = tmp_path_factory.mktemp("train_spec") / SPEC.name
    spec.write_text(text.replace('hf("smollm2-135m-instruct")', f'hf("{tiny_model}")'))
    out = tmp_path_factory.mktemp("train") / "runs"
    # mid-run: step 1 (or a later one) is checkpointed, the run has steps left to play
    killed_at = e2e.kill_run_when(e2e.cmd("run", str(spec), "--out", str(out), "--quiet"), out,
                                  lambda o: s if (s := e2e.latest_step(o)) is not None and s >= 1 else None, 600)
    assert killed_at < STEPS, "the kill landed after the last step"
    run_dir = e2e.only_run(out)
    e2e.resume_here(run_dir)  # in this process: the killed one is gone
    return run_dir


def test_kill_9_then_resume_trains_every_step_exactly_once(resumed_run):
    run_dir = resumed_run
    con = open_store(run_dir)
    steps = con.execute("SELECT role, step, loss, reward_mean, lr, tokens, grad_norm FROM train_steps ORDER BY step").fetchall()
    assert [(r, s) for r, s, *_ in steps] == [("solver", k) for k in range(1, STEPS + 1)]
    assert all(row[3] is not None and row[5] > 0 and row[6] is not None for row in steps)
    # every optimizer step exactly once: the final weights have seen STEPS updates
    state = json.loads((run_dir / "checkpoints" / "solver" / f"step-{STEPS}" / "trainer_state.json").read_text())
    assert state["version"] == STEPS and state["step"] == STEPS
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"] == STEPS
    assert not (run_dir / "checkpoints" / "solver" / "step-1").exists()  # keep_checkpoints = 1
    # 2 sessions per step, each step's sessions once in the views
    assert con.execute("SELECT count(*), count(DISTINCT session_id) FROM sessions WHERE status = 'ok'").fetchone() == (
        2 * STEPS, 2 * STEPS)
    rows = con.execute("SELECT step, session_id, len(completion_ids), len(logprobs), trajectory FROM rollouts ORDER BY step").fetchall()
    assert sorted({r[0] for r in rows}) == list(range(1, STEPS + 1)) and len(rows) == 2 * STEPS
    assert all(n == m and n > 0 and traj for _, _, n, m, traj in rows)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["resumes"] == 1
    # metrics compare steps
    from askspec.runtime.engine.metrics import run_metrics

    rows, errors = run_metrics(str(run_dir))
    assert sorted([(r["metric"], r["by"], r["n"]) for r in rows], key=lambda row: row[1]["step"]) == [
        ("mean_reward", {"step": k}, 2) for k in range(1, STEPS + 1)]


def test_eval_only_plays_without_training_and_a_checkpoint_is_a_model(resumed_run, tmp_path, e2e):
    out = tmp_path / "runs"
    ckpt = resumed_run / "checkpoints" / "solver" / f"step-{STEPS}"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "config.json").exists()
    # a model declaration can point at the run's checkpoint
    spec = tmp_path / "eval.ask"
    spec.write_text(SPEC.read_text().replace('hf("smollm2-135m-instruct")', f'hf("{ckpt}")'))
    eval_dir = e2e.run_here(spec, out / "eval", "--eval-only")
    con = open_store(eval_dir)
    assert con.execute("SELECT count(*) FROM train_steps").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM rollouts").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM sessions WHERE status = 'ok'").fetchone() == (4,)
    assert not (eval_dir / "checkpoints").exists()


def test_refusals_are_diagnostics_at_the_spec_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ASKSPEC_DEBUG", raising=False)  # as a user's shell: no traceback shown
    spec = tmp_path / "alt.ask"
    spec.write_text(SPEC.read_text() + "\nschedule nested { outer = solver; inner = solver; outer_reward = intrinsic }\n")
    rc, err = askspec(capsys, "run", str(spec), "--out", str(tmp_path / "runs"))
    assert rc == 1
    line = spec.read_text().splitlines().index("schedule nested { outer = solver; inner = solver; outer_reward = intrinsic }") + 1
    assert f"alt.ask:{line}:1: error[E405]: the nested schedule's outer and inner roles are both 'solver'" in err
    assert "Traceback" not in err and "internal error" not in err
    rc, err = askspec(capsys, "run", str(SPEC), "--out", str(tmp_path / "runs"), "--sessions", "2")
    assert rc == 1 and "--sessions is for --eval-only runs" in err
    replay = tmp_path / "r.json"
    replay.write_text('{"sessions": [{"solver": ["\\\\boxed{3}"], "echo": ["ok"]}]}')
    rc, err = askspec(capsys, "run", str(SPEC), "--out", str(tmp_path / "runs"), "--replay", str(replay))
    assert rc == 1 and "Traceback" not in err and "internal error" not in err
    assert "role 'solver' is trained but its model runs on the replay backend" in err


def test_the_spec_trains_the_real_smollm2(tmp_path, e2e):
    """The one training run on the real SmolLM2-135M (the others use the tiny model): two
    GRPO steps of the spec as written update its weights and checkpoint a loadable model."""
    text = SPEC.read_text()
    assert f"steps = {STEPS};" in text
    spec = tmp_path / SPEC.name
    spec.write_text(text.replace(f"steps = {STEPS};", "steps = 2;"))
    run_dir = e2e.run_here(spec, tmp_path / "runs")
    con = open_store(run_dir)
    steps = con.execute("SELECT step, loss, grad_norm, tokens, skipped FROM train_steps ORDER BY step").fetchall()
    assert [s[0] for s in steps] == [1, 2]
    # a step trains unless its group's rewards were equal (then it is recorded as skipped)
    assert all((s[1] is not None and s[2] is not None and s[3] > 0) or s[4] for s in steps), steps
    ckpt = run_dir / "checkpoints" / "solver" / "step-2"
    config = json.loads((ckpt / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and (ckpt / "model.safetensors").stat().st_size > 100_000_000  # SmolLM2-135M
