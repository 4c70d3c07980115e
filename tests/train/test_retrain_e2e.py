"""The `retrain` stage end to end on CPU (tests/train/specs/tiny_pq.ask on the tiny random
Llama of tests/conftest.py, 8 new tokens): SOAR's evaluation in miniature. One nested outer
step promotes a student copy; the `ps` stage evaluates the promoted student against the
initial one; `pq_student` trains a fresh student (the spec's weights, a new optimizer) on
the promoted dataset for one curriculum step and on the train set for two; `pq` evaluates
it. Checked: each stage's steps and sessions, the items each retrain step played, and that
the retrained student started from the spec's weights, not the promoted ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.runtime.store.views import open_store

SPEC = Path(__file__).parent / "specs" / "tiny_pq.ask"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, e2e, tiny_model) -> Path:
    return e2e.run_to_end(SPEC, tmp_path_factory.mktemp("pq") / "runs", "--set", f'weights="{tiny_model}"')


def test_stages_train_and_play_in_order(run_dir):
    con = open_store(run_dir)
    steps = con.execute("SELECT step, role, stage, metrics->>'phase', CAST(metrics->>'items' AS INT) FROM train_steps "
                        "ORDER BY step").fetchall()
    assert steps == [(1, "teacher", "rl", "outer", None), (3, "student", "pq_student", "pq_student", 2),
                     (4, "student", "pq_student", "pq_student", 2), (5, "student", "pq_student", "pq_student", 2)]
    sessions = con.execute("SELECT stage, game, weights, count(*) FROM sessions "
                           "GROUP BY ALL ORDER BY ALL").fetchall()
    assert sessions == [("pq", "test", "trained", 2), ("pq_student", "practice", None, 6),
                        ("ps", "test", "initial", 2), ("ps", "test", "trained", 2),
                        ("rl", "evaluate", None, 2), ("rl", "practice", None, 2), ("rl", "teach", None, 1)]


def test_curriculum_plays_the_promoted_dataset_then_the_train_set(run_dir):
    con = open_store(run_dir)
    (items,) = con.execute("SELECT data->'items' FROM nested_events WHERE event = 'promotion'").fetchone()
    promoted = {it["question"] for it in json.loads(items)}
    assert len(promoted) == 2
    played = con.execute("SELECT step, params->'qa'->>'question' FROM sessions "
                         "WHERE stage = 'pq_student' ORDER BY session_id").fetchall()
    assert {q for s, q in played if s == 3} == promoted  # step 1 of the stage: the promoted questions alone
    assert {q for s, q in played if s in (4, 5)} == {"2+2?", "3+5?"}  # then the train set


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_the_retrained_student_starts_from_the_specs_weights(run_dir, tiny_model):
    initial = _weights(tiny_model)
    ck = run_dir / "checkpoints" / "student"

    def distance(state: dict) -> float:
        return max(float((state[k].float() - initial[k].float()).abs().max()) for k in initial if k in state)

    assert distance(_weights(ck / "step-2")) > 1e-5  # the promoted copy: one inner step at lr 1e-3
    assert distance(_weights(ck / "step-5")) < 1e-8  # three steps at lr 1e-12 from the spec's weights
