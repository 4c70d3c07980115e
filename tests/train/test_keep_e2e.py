"""Choosing a stage's checkpoint (`keep`) and sampling a retrain stage's items from a role
(`sample`), end to end on CPU (tests/train/specs/tiny_keep.ask on the tiny random Llama of
tests/conftest.py, 8 new tokens). Two nested outer steps each promote a student copy;
`keep = best(accuracy)` gives the student the more accurate one when the train stage ends.
The retrain stage plays the `write` game once with the trained teacher, trains a fresh
student on its replies mixed with the train set, and stops where its reward levels off
(`keep = plateau(...)`): its later steps are not played and the evaluate stage after it
plays the weights of the step it stopped at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.runtime.store.views import open_store
from askspec.runtime.train.stages import plateau

SPEC = Path(__file__).parent / "specs" / "tiny_keep.ask"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, e2e, tiny_model) -> Path:
    return e2e.run_to_end(SPEC, tmp_path_factory.mktemp("keep") / "runs", "--set", f'weights="{tiny_model}"')


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    """The same weights (a checkpoint may leave out a tied tensor that a state dict holds)."""
    common = a.keys() & b.keys()
    return len(common) >= min(len(a), len(b)) > 0 and all(bool((a[k] == b[k]).all()) for k in common)


def test_the_train_stage_keeps_the_most_accurate_promoted_student(run_dir):
    con = open_store(run_dir)
    promoted = con.execute("SELECT n.step, c.value FROM nested_events n JOIN nested_events c ON c.step = n.step "
                           "AND c.event = 'copy' AND c.dataset = n.dataset AND c.copy = n.copy "
                           "WHERE n.event = 'promotion' ORDER BY n.step").fetchall()
    assert len(promoted) == 2  # both outer steps promoted
    best_step, best_acc = max(promoted, key=lambda r: (r[1], -r[0]))
    (kept,) = con.execute("SELECT step, value, data FROM nested_events WHERE event = 'keep'").fetchall()
    assert kept[0] == 2 and kept[1] == pytest.approx(best_acc)  # recorded at the train stage's last step
    assert json.loads(kept[2])["kept"]["step"] == best_step
    ck = run_dir / "checkpoints" / "student"
    # the train stage's last checkpoint holds the kept student: the weights kept when it was promoted (the
    # hf sampling of a CPU run is not bit-for-bit repeatable, so which promotion wins is read from the run)
    from safetensors.torch import load_file

    kept_file = run_dir / "checkpoints" / "nested" / f"best-step-{best_step}.safetensors"
    assert [p.name for p in kept_file.parent.glob("best-step-*")] == [kept_file.name]  # only the kept one stays
    assert _same(_weights(ck / "step-2"), load_file(str(kept_file)))
    if best_step == 1:  # the last promotion was not kept: the student went back to the first one's weights
        assert _same(_weights(ck / "step-2"), _weights(ck / "step-1"))


def test_the_retrain_stage_trains_on_the_items_sampled_from_the_teacher(run_dir):
    con = open_store(run_dir)
    (sid,) = con.execute("SELECT session_id FROM sessions WHERE stage = 'teacher_eval' AND game = 'write'").fetchone()
    replies = [r for (r,) in con.execute("SELECT text FROM turns WHERE session_id = ? AND role = 'teacher' "
                                         "ORDER BY turn_index", [sid]).fetchall()]
    assert len(replies) == 3
    (first,) = con.execute("SELECT metrics FROM train_steps WHERE stage = 'teacher_eval' ORDER BY step LIMIT 1").fetchone()
    first = json.loads(first)
    assert (first["sampled"], first["items"]) == (3, 5)  # 3 sampled + the 2 of the train set, mixed
    played = {q for (q,) in con.execute("SELECT params->'qa'->>'question' FROM sessions "
                                        "WHERE stage = 'teacher_eval' AND game = 'practice'").fetchall()}
    assert played <= {r.strip() for r in replies} | {r for r in replies} | {"2+2?", "3+5?"}
    assert played & set(replies), "no sampled question was played"


def test_the_retrain_stage_stops_at_the_plateau_and_hands_on_that_step(run_dir):
    con = open_store(run_dir)
    rows = con.execute("SELECT step, metrics FROM train_steps WHERE stage = 'teacher_eval' ORDER BY step").fetchall()
    rewards = [json.loads(m)["reward_mean"] for _, m in rows]
    # the stage stopped at the first step the rule holds, computed again from the recorded curve
    first = next(i for i in range(1, len(rewards) + 1) if plateau(rewards[:i], 1, 1.0) is not None)
    assert len(rows) == first < 8  # no step after it (retrain_steps = 8)
    last_step, last = rows[-1][0], json.loads(rows[-1][1])
    assert last["stopped"] is True and last["plateau"]["slope"] < last["plateau"]["max_slope"]
    ck = run_dir / "checkpoints" / "student"
    assert (ck / f"step-{last_step}").exists()  # the kept step is checkpointed whatever save_every says
    final = max(int(p.name[5:]) for p in ck.glob("step-*"))
    assert final > last_step and _same(_weights(ck / f"step-{final}"), _weights(ck / f"step-{last_step}"))
    evaluated = con.execute("SELECT count(*) FROM sessions WHERE stage = 'teacher_eval_test'").fetchone()
    assert evaluated == (2,)
