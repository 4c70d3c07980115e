"""`keep = plateau(..., select = posthoc)` end to end on CPU (tests/train/specs/
tiny_posthoc.ask on the tiny random Llama of tests/conftest.py): SOAR's checkpoint
selection after the run (App. B.6). The fresh student trains every one of its steps;
its weights are kept every `every` steps; after the last step the plateau is selected over
the whole recorded curve, only the averaging window's checkpoints stay on disk, and the
evaluate stage after it plays each of them (a group per checkpoint, so pass@k averages
over them); the later stages' weights are the window's first checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from askspec.runtime.store.views import open_store
from askspec.runtime.train.stages import averaged_checkpoints, plateau_posthoc

SPEC = Path(__file__).parent / "specs" / "tiny_posthoc.ask"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, e2e, tiny_model) -> Path:
    return e2e.run_to_end(SPEC, tmp_path_factory.mktemp("posthoc") / "runs", "--set", f'weights="{tiny_model}"')


def test_the_stage_trains_every_step_and_selects_afterwards(run_dir):
    import json

    con = open_store(run_dir)
    rows = con.execute("SELECT step, reward_mean, metrics FROM train_steps WHERE stage = 'fresh' ORDER BY step").fetchall()
    assert [r[0] for r in rows] == [2, 3, 4, 5, 6, 7]  # all 6 steps: no early stop
    last = json.loads(rows[-1][2]) if isinstance(rows[-1][2], str) else rows[-1][2]
    hit = plateau_posthoc([r[1] for r in rows], 1, 1.0)
    assert last["selected_step"] == hit["step"] and last["plateau"]["step"] == hit["step"]
    window = averaged_checkpoints([1, 2, 3, 4, 5, 6], hit["step"], 2, 6)
    assert last["checkpoints"] == window and len(window) >= 2  # the averaging plays more than one
    kept = sorted(int(p.stem[5:]) for p in (run_dir / "checkpoints" / "stages" / "fresh").glob("step-*.safetensors"))
    assert kept == window  # the others were removed once selected


def test_the_evaluation_plays_each_checkpoint_of_the_window(run_dir):
    import json

    con = open_store(run_dir)
    (metrics,) = con.execute("SELECT metrics FROM train_steps WHERE stage = 'fresh' ORDER BY step DESC LIMIT 1").fetchone()
    window = (json.loads(metrics) if isinstance(metrics, str) else metrics)["checkpoints"]
    groups = con.execute("SELECT group_id, count(*) FROM sessions WHERE stage = 'fresh_eval' GROUP BY group_id "
                         "ORDER BY group_id").fetchall()
    assert groups == [(f"fresh_eval-trained-c{k}-e000", 2) for k in range(len(window))]


def test_the_later_stages_get_the_first_checkpoint_of_the_window(run_dir):
    import json

    from safetensors.torch import load_file

    con = open_store(run_dir)
    (metrics,) = con.execute("SELECT metrics FROM train_steps WHERE stage = 'fresh' ORDER BY step DESC LIMIT 1").fetchone()
    first = (json.loads(metrics) if isinstance(metrics, str) else metrics)["checkpoints"][0]
    selected = load_file(str(run_dir / "checkpoints" / "stages" / "fresh" / f"step-{first}.safetensors"))
    final = load_file(str(run_dir / "checkpoints" / "student" / "step-8" / "model.safetensors"))
    common = selected.keys() & final.keys()
    assert common and all(bool((selected[k] == final[k]).all()) for k in common)
