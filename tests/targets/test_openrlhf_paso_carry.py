"""The state a PasoDoble-shaped job carries across its phases, against the local run:
tests/targets/specs/pasodoble_carry.ask (AdamW with its default betas; a novelty()
history the second iteration's passage is judged against) compiled and run by its own
driver.sh, each phase's OpenRLHF launch replaced by askspec's trainer on CPU
(openrlhf_standin.py: it loads and saves the role's carried checkpoint where driver.sh's
`--ckpt.load_enable --ckpt.path` point OpenRLHF, and its agents' histories start from the
phase's history.json, as the generated agent's do). Over two iterations the buffer's
events and contents, and every phase's weights, equal the local run's: the second
iteration's questions carry novelty 0 (the history kept the first iteration's passage;
a reset history would give 1) and its weights come from AdamW's carried moments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.runtime.store.views import open_store
from askspec.runtime.targets.openrlhf import phase_data

from test_openrlhf_paso_e2e import EVENT_FIELDS, SERVE_FROZEN, _drive, local  # noqa: F401  (its local run of `spec`)

pytestmark = [pytest.mark.slow, pytest.mark.multicore]  # driver.sh with its frozen servers and launches

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def spec(tmp_path_factory, tiny_model) -> Path:
    text = (HERE / "specs" / "pasodoble_carry.ask").read_text()
    path = tmp_path_factory.mktemp("carry_spec") / "pasodoble_carry.ask"
    path.write_text(text.replace('hf("smollm2-135m-instruct")', f'hf("{tiny_model}")'))
    return path


@pytest.fixture(scope="module")
def job(spec, tmp_path_factory) -> tuple[Path, list]:
    tmp = tmp_path_factory.mktemp("carry_job")
    job = tmp / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(job)]) == 0
    for serve in job.glob("phase-*/serve_frozen.sh"):
        serve.write_text(SERVE_FROZEN)
    rc, launches = _drive(job, tmp)
    assert rc == 0
    return job, launches


def test_buffer_and_weights_equal_the_local_runs_over_two_iterations(job, local) -> None:
    from safetensors.torch import load_file

    job, launches = job
    ckpt = job / "ckpt"
    # iteration 2's phases start from the state their role's iteration-1 phase saved
    assert launches == [["phase-1-proposer", launches[0][1]], ["phase-2-solver", launches[0][1]],
                        ["phase-1-proposer", f"{ckpt}/iter-1/proposer"], ["phase-2-solver", f"{ckpt}/iter-1/solver"]]
    want = open_store(local).execute(f"SELECT {EVENT_FIELDS} FROM buffer_events ORDER BY step, seq").fetchall()
    got = open_store(job / phase_data.STORE).execute(
        f"SELECT {EVENT_FIELDS} FROM buffer_events ORDER BY step, seq").fetchall()
    assert got == want
    pushed = [(step, json.loads(value)["pass_rate"]) for step, _, event, _, value, *_ in want if event == "push"]
    assert pushed == [(1, 1.0), (1, 1.0), (3, 0.0), (3, 0.0)]  # the history kept iteration 1's passage
    state = json.loads((job / phase_data.STATE).read_text())
    assert state["buffers"] == json.loads((local / "checkpoints" / "buffers" / "step-4.json").read_text())
    # the proposer's iteration-2 agents started from iteration 1's novelty() call
    ((fn, _, text, _),) = json.loads((job / "phase-1-proposer" / phase_data.HISTORY).read_text())
    assert (fn, text) == ("novelty", "Cats purr when calm.")
    # every phase's weights: the local run's, AdamW's moments carried from the role's previous phase
    for step, role, it in ((1, "proposer", 1), (2, "solver", 1), (3, "proposer", 2), (4, "solver", 2)):
        mine = load_file(str(ckpt / f"iter-{it}" / role / "model.safetensors"))
        theirs = load_file(str(local / "checkpoints" / role / f"step-{step}" / "model.safetensors"))
        assert mine.keys() == theirs.keys()
        assert all(mine[k].equal(theirs[k]) for k in theirs), (step, role)
    for role in ("proposer", "solver"):  # one carried copy per role is kept: the last phase's
        carried = json.loads((ckpt / "iter-2" / f"{role}-ds" / "_actor" / "trainer_state.json").read_text())
        assert carried["version"] == 2 and set(carried["optimizer_steps"].values()) == {2.0}
        assert not (ckpt / "iter-1" / f"{role}-ds").exists()
