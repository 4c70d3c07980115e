"""The `alternating` schedule end to end on CPU (the tiny random Llama of
tests/conftest.py, 8 new tokens): PasoDoble's offline loop in miniature
(tests/train/specs/tiny_alternating.ask: T_P = 2, T_S = 1, iterations = 2), killed with
SIGKILL in the middle of a proposer phase and resumed; the recorded phases, pushes,
evictions and train steps are checked against the schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.runtime.store.views import open_store

SPEC = Path(__file__).parent / "specs" / "tiny_alternating.ask"
pytestmark = pytest.mark.slow
# global step -> (phase, iteration): P P S per iteration
SCHEDULE = {1: ("proposer", 1), 2: ("proposer", 1), 3: ("solver", 1), 4: ("proposer", 2), 5: ("proposer", 2),
            6: ("solver", 2)}


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, e2e, tiny_model) -> Path:
    out = tmp_path_factory.mktemp("alt") / "runs"
    # step 4 checkpointed, step 5 (same phase) being played
    killed_at = e2e.kill_run_when(e2e.cmd("run", str(SPEC), "--out", str(out), "--quiet", "--set",
                                          f'weights="{tiny_model}"'), out,
                                  lambda o: s if (s := e2e.latest_step(o)) is not None and s >= 4 else None, 800)
    run_dir = e2e.only_run(out)
    assert killed_at < 6, "the run finished before it could be killed"
    e2e.resume(run_dir)
    return run_dir


def test_every_step_of_the_schedule_exactly_once(resumed_run):
    con = open_store(resumed_run)
    rows = con.execute("SELECT role, step, metrics->>'phase', CAST(metrics->>'iteration' AS INT) FROM train_steps "
                       "ORDER BY step").fetchall()
    assert [(r, s, ph, it) for r, s, ph, it in rows] == [(SCHEDULE[s][0], s, *SCHEDULE[s]) for s in range(1, 7)]
    # each role its own weights and optimizer: the proposer took 4 steps, the solver 2
    ck = resumed_run / "checkpoints"
    assert json.loads((ck / "proposer" / "step-6" / "trainer_state.json").read_text())["version"] == 4
    assert json.loads((ck / "solver" / "step-6" / "trainer_state.json").read_text())["version"] == 2
    # the frozen role served its current weights: rollouts carry the version that sampled them
    versions = dict(con.execute("SELECT step, max(policy_version) FROM rollouts WHERE role = 'solver' "
                                "GROUP BY step").fetchall())
    assert versions[1] == versions[2] == 0 and versions[4] == versions[5] == 1
    assert json.loads((resumed_run / "manifest.json").read_text())["resumes"] == 1


def test_pushes_replays_and_evictions_follow_the_schedule(resumed_run):
    con = open_store(resumed_run)
    ev = con.execute("SELECT step, phase, event, item, reason, score FROM buffer_events ORDER BY seq").fetchall()
    pushes = [(s, item) for s, _, e, item, _, _ in ev if e == "push"]
    # each proposer step plays one topic, 2 proposals, each pushed; ids in push order, once each
    assert pushes == [(1, 0), (1, 1), (2, 2), (2, 3), (4, 4), (4, 5), (5, 6), (5, 7)]
    assert all(SCHEDULE[s][0] == ph for s, ph, *_ in ev)
    replays = [(s, item) for s, _, e, item, _, _ in ev if e == "replay"]
    assert [s for s, _ in replays] == [3, 6]  # one item per solver step
    evicted = [(item, reason) for _, _, e, item, reason, _ in ev if e == "evict"]
    assert len({i for i, _ in evicted}) == len(evicted)  # an item leaves once
    for (s, _, e, item, reason, score) in ev:
        if e == "evict" and reason == "capacity":
            assert SCHEDULE[s][0] == "proposer"
        if e == "evict" and reason == "solved":
            assert score == 1.0
    held = [i for (i,) in con.execute("SELECT item FROM buffer_items ORDER BY item").fetchall()]
    assert held == sorted(set(range(8)) - {i for i, _ in evicted}) and len(held) <= 3  # capacity 3
    # the buffer as checkpointed at the end agrees with the store
    state = json.loads((resumed_run / "checkpoints" / "buffers" / "step-6.json").read_text())
    assert state["questions"]["ids"] == held
