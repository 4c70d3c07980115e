"""The `nested` schedule end to end on CPU (the tiny random Llama of tests/conftest.py, 8
new tokens): SOAR's loop in miniature (tests/train/specs/tiny_nested.ask: 2 datasets of 4
replies, 2 copies, 2 inner steps, 2 outer steps, a threshold every step passes), killed
with SIGKILL in the middle of the second outer step and resumed. The recorded inner steps,
outer rewards, decisions and promotions are checked against the schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.runtime.store.views import open_store

SPEC = Path(__file__).parent / "specs" / "tiny_nested.ask"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, e2e, tiny_model) -> Path:
    out = tmp_path_factory.mktemp("nested") / "runs"

    def inside_the_second_inner_loop(out: Path) -> bool | None:
        """Outer step 1 checkpointed and a copy of step 2 trained: the kill lands inside the inner loop."""
        work = list(out.glob("*/checkpoints/nested/work/*.safetensors")) if out.exists() else []
        return True if e2e.latest_step(out) == 1 and work else None

    e2e.kill_run_when(e2e.cmd("run", str(SPEC), "--out", str(out), "--quiet", "--set", f'weights="{tiny_model}"'), out,
                      inside_the_second_inner_loop, 800)
    run_dir = e2e.only_run(out)
    e2e.resume(run_dir)
    return run_dir


def test_every_outer_step_exactly_once(resumed_run):
    con = open_store(resumed_run)
    rows = con.execute("SELECT role, step, metrics->>'phase', CAST(metrics->>'trajectories' AS INT), "
                       "CAST(metrics->>'groups' AS INT) FROM train_steps ORDER BY step").fetchall()
    # only the outer role is updated by the schedule; its one group is the step's 2 datasets x 4 replies
    assert [(r, s, ph) for r, s, ph, _, _ in rows] == [("teacher", 1, "outer"), ("teacher", 2, "outer")]
    assert all((n, groups) == (8, 1) for *_, n, groups in rows)
    assert json.loads((resumed_run / "checkpoints" / "teacher" / "step-2" / "trainer_state.json").read_text())["version"] == 2
    assert json.loads((resumed_run / "manifest.json").read_text())["resumes"] == 1
    # the teacher's replies carry the grounded reward of their dataset
    got = con.execute("SELECT count(*), count(DISTINCT session_id) FROM rewards WHERE role = 'teacher' "
                      "AND name = 'grounded'").fetchone()
    assert got == (16, 2)


def test_inner_steps_rewards_and_promotions(resumed_run):
    con = open_store(resumed_run)
    ev = con.execute("SELECT step, event, dataset, copy, inner_step, value, data FROM nested_events ORDER BY seq").fetchall()
    for step, steps in ((1, 2), (2, 2)):
        mine = [e for e in ev if e[0] == step]
        inner = [(k, j, i) for _, e, k, j, i, _, _ in mine if e == "inner_step"]
        assert inner == [(k, j, i) for k in (1, 2) for j in (1, 2) for i in range(1, steps + 1)]
        (base,) = [v for _, e, _, _, _, v, _ in mine if e == "baseline"]
        copies = {(k, j): v for _, e, k, j, _, v, _ in mine if e == "copy"}
        datasets = {k: (v, json.loads(d)) for _, e, k, _, _, v, d in mine if e == "dataset"}
        assert sorted(datasets) == [1, 2]
        for k, (reward, data) in datasets.items():
            assert reward == pytest.approx((copies[(k, 1)] - base + copies[(k, 2)] - base) / 2)
            assert len(data["items"]) == 4 and all(item["question"] for item in data["items"])
        (decision,) = [json.loads(d) for _, e, *_, d in mine if e == "decision"]
        assert decision["promoted"] is True and decision["threshold"] == -1.0
        assert decision["mean_reward"] == pytest.approx((datasets[1][0] + datasets[2][0]) / 2)
        (promotion,) = [(k, j, json.loads(d)) for _, e, k, j, _, _, d in mine if e == "promotion"]
        best = max((1, 2), key=lambda k: (datasets[k][0], -k))
        assert promotion[0] == best and promotion[2]["items"] == datasets[best][1]["items"]
        accs = [copies[(best, 1)], copies[(best, 2)]]
        assert promotion[1] == (1 if accs[0] <= accs[1] else 2)  # the lower median of two copies
    # the loop's state went through the checkpoint: both promoted datasets are kept
    state = json.loads((resumed_run / "checkpoints" / "nested" / "step-2.json").read_text())
    assert [p["step"] for p in state["promotions"]] == [1, 2]
