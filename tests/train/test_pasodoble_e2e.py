"""specs/pasodoble.ask itself, end to end on CPU (on the tiny random Llama of
tests/conftest.py, 8 new tokens), with the smoke settings of its header: the cold start
(one sft step per role), the offline schedule (T_P = 2, T_S = 1, 2 iterations, I = J = 2)
and the evaluation stages (Table 1's Base and Coldstart baselines, the held-out one), killed with SIGKILL during the train stage after the sft stages
finished, then resumed; every stage's steps, sessions, buffer events and metrics are
checked against the schedule. The online profile runs too, and its update gate skips the
updates of a batch without a question kept for the solver (none pushed).

A random model with 8 new tokens never writes a well-formed <problem>/<answer> pair, so no
question is valid, nothing is pushed and the solver phases replay an empty buffer (the
buffer's pushes, replays and evictions with a filled buffer: test_schedule_e2e.py); the
checks below hold whatever the model writes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from askspec.runtime.store.views import open_store

SPECS = Path(__file__).resolve().parents[2] / "specs"
pytestmark = pytest.mark.slow
SMOKE = ["--set", "proposals=2", "--set", "solutions=2", "--set", "max_tokens=8", "--set", "cold_steps=1",
         "--set", "cold_batch=1", "--set", "eval_items=1", "--set", "eval_samples=1", "--set", "eval_tokens=8",
         "--set", "save_every=1"]
OFFLINE = ["--set", "proposer_steps=2", "--set", "solver_steps=1", "--set", "iterations=2"]
# global step -> (stage, phase, iteration, role) of the steps that train: the cold start, then
# P P S per iteration (step 1 evaluates Base, step 4 Coldstart, step 11 the held-out set)
SCHEDULE = {2: ("sft_proposer", "sft_proposer", 1, "proposer"), 3: ("sft_solver", "sft_solver", 1, "solver"),
            5: ("rl", "proposer", 1, "proposer"), 6: ("rl", "proposer", 1, "proposer"), 7: ("rl", "solver", 1, "solver"),
            8: ("rl", "proposer", 2, "proposer"), 9: ("rl", "proposer", 2, "proposer"), 10: ("rl", "solver", 2, "solver")}
FIRST_RL = 5
EVAL_STEP = 11


@pytest.fixture(scope="module")
def spec(tmp_path_factory, tiny_model) -> Path:
    """A copy of specs/pasodoble.ask (with its prompts and data: a spec reads files inside its
    own folder only) whose base model is the tiny one."""
    folder = tmp_path_factory.mktemp("paso_spec")
    for sub in ("prompts", "data"):
        shutil.copytree(SPECS / sub, folder / sub)
    text = (SPECS / "pasodoble.ask").read_text()
    assert text.count('hf("smollm2-135m-instruct")') == 1, "pasodoble.ask's base model moved: update this copy"
    (folder / "pasodoble.ask").write_text(text.replace('hf("smollm2-135m-instruct")', f'hf("{tiny_model}")'))
    return folder / "pasodoble.ask"


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory, e2e, spec) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("paso") / "runs"
    # the sft stages and the first rl step are checkpointed; the rl stage is being played
    killed_at = e2e.kill_run_when(e2e.cmd("run", str(spec), "--out", str(out), "--quiet", *SMOKE, *OFFLINE), out,
                                  lambda o: s if (s := e2e.latest_step(o)) is not None and s >= FIRST_RL else None, 800)
    run_dir = e2e.only_run(out)
    assert killed_at < EVAL_STEP, "the run finished before it could be killed"
    e2e.resume(run_dir)
    return run_dir, killed_at


def test_every_stage_and_step_exactly_once_after_the_kill(offline_run):
    run_dir, killed_at = offline_run
    con = open_store(run_dir)
    rows = con.execute("SELECT step, stage, metrics->>'phase', CAST(metrics->>'iteration' AS INT), role, "
                       "metrics->>'algorithm', metrics->>'skipped' FROM train_steps ORDER BY step").fetchall()
    assert [r[:5] for r in rows] == [(s, *SCHEDULE[s]) for s in sorted(SCHEDULE)]  # the evaluations train nothing
    assert [r[5] for r in rows] == ["sft", "sft"] + ["grpo"] * 6
    # the event log itself, not only the views: each step recorded once, the sft steps by
    # the killed process (the resume did not replay them)
    raw = [json.loads(line) for line in (run_dir / "events" / "train_steps.ndjson").read_text().splitlines()]
    assert sorted((r["step"], r["role"]) for r in raw) == [(s, SCHEDULE[s][3]) for s in sorted(SCHEDULE)]
    assert [r["gen"] for r in raw if r["step"] <= 3] == [0, 0] and killed_at >= FIRST_RL
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["resumes"] == 1
    # each role's policy version counts its steps that reached the update: one sft step, then
    # its rl steps whose gate was open and buffer not empty (a zero-advantage skip counts)
    ck = run_dir / "checkpoints"
    for role in ("proposer", "solver"):
        updates = sum(1 for r in rows if r[4] == role and r[6] not in ("gate", "empty_buffer"))
        assert json.loads((ck / role / f"step-{EVAL_STEP}" / "trainer_state.json").read_text())["version"] == updates
    # sessions: one passage a proposer step, the held-out item once per weights (Base: the
    # initial ones, Coldstart: the sft ones); each once
    sessions = con.execute("SELECT stage, game, weights, count(*), count(DISTINCT session_id) "
                           "FROM sessions GROUP BY ALL ORDER BY ALL").fetchall()
    replayed = con.execute("SELECT count(*) FROM sessions WHERE game = 'practice'").fetchone()[0]
    assert [s for s in sessions if s[1] != "practice"] == [
        ("base_4shot", "test_4shot", "initial", 1, 1), ("coldstart", "test", "trained", 1, 1),
        ("heldout", "test", "initial", 1, 1), ("heldout", "test", "trained", 1, 1), ("rl", "propose", None, 4, 4)]
    steps = dict(con.execute("SELECT step, count(*) FROM sessions WHERE game = 'propose' "
                             "GROUP BY ALL").fetchall())
    assert steps == {5: 1, 6: 1, 8: 1, 9: 1}
    # the evaluation asked the evaluated role on its own model (temperature 0.6, top_p 0.95)
    assert con.execute("SELECT DISTINCT model FROM turns t JOIN sessions s USING (session_id) "
                       "WHERE s.stage = 'heldout'").fetchall() == [("eval_model",)]
    # a solver step replays up to `replay_questions` buffered questions, one session each
    (replays,) = con.execute("SELECT count(*) FROM buffer_events WHERE event = 'replay'").fetchone()
    assert replayed == replays


def test_buffer_events_follow_the_schedule(offline_run):
    run_dir, _ = offline_run
    con = open_store(run_dir)
    rows = con.execute("SELECT step, metrics->>'skipped' FROM train_steps WHERE role = 'solver' AND stage = 'rl' "
                       "ORDER BY step").fetchall()
    ev = con.execute("SELECT step, phase, event, item FROM buffer_events ORDER BY seq").fetchall()
    assert all(SCHEDULE[s][1] == ("solver" if e in ("replay", "evict") and ph == "solver" else ph)
               for s, ph, e, _ in ev)
    pushes = [(s, item) for s, _, e, item in ev if e == "push"]
    assert all(SCHEDULE[s][1] == "proposer" for s, _ in pushes)
    assert [item for _, item in pushes] == list(range(len(pushes)))  # ids in push order, once each
    # a push per valid, unsolved question: never more than the well-formed proposals of the step
    formed = dict(con.execute("SELECT step, sum(CAST(vars->>'well_formed' AS INT)) "
                              "FROM sessions WHERE game = 'propose' GROUP BY ALL").fetchall())
    for step in (5, 6, 8, 9):
        assert sum(1 for s, _ in pushes if s == step) <= formed[step]
    # a solver step replays when the buffer holds an item, else it is skipped as empty
    for step, skipped in rows:
        held = sum(1 for s, _, e, _ in ev if s < step and e == "push") - sum(
            1 for s, _, e, _ in ev if s < step and e == "evict")
        assert (skipped == "empty_buffer") == (held == 0), (step, skipped, held)
    state = json.loads((run_dir / "checkpoints" / "buffers" / f"step-{EVAL_STEP}.json").read_text())
    held = [i for (i,) in con.execute("SELECT item FROM buffer_items ORDER BY item").fetchall()]
    assert state["questions"]["ids"] == held


def test_metrics_per_stage(offline_run, e2e):
    run_dir, _ = offline_run
    done = subprocess.run(e2e.cmd("metrics", str(run_dir), "--format", "json"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    keyed = {(r["stage"], r["metric"], tuple(sorted(r["by"].items()))): r for r in json.loads(done.stdout)}
    assert keyed[("sft_proposer", "loss", (("role", "proposer"),))]["n"] == 1
    assert keyed[("sft_solver", "loss", (("role", "solver"),))]["n"] == 1
    assert keyed[("rl", "reward_mean", (("role", "proposer"),))]["n"] == 4
    assert keyed[("rl", "format_rate", ())]["n"] == 4  # the spec's metrics, over the rl stage's propose sessions
    con = open_store(run_dir)
    for weights in ("trained", "initial"):
        (correct,) = con.execute("SELECT (vars->>'correct')::BOOLEAN FROM sessions WHERE stage = 'heldout' "
                                 "AND weights = ?", [weights]).fetchone()
        row = keyed[("heldout", "pass@1", (("game", "test"), ("weights", weights)))]
        assert row["n"] == 1 and row["value"] == float(correct)


def test_the_online_profile_skips_the_update_of_a_batch_without_a_kept_question(tmp_path, e2e, spec):
    out = tmp_path / "runs"
    done = subprocess.run(e2e.cmd("run", str(spec), "--profile", "online", "--set", "online_steps=1", "--out",
                                      str(out), "--quiet", *SMOKE), capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stderr
    run_dir = e2e.only_run(out)
    con = open_store(run_dir)
    rows = con.execute("SELECT step, role, stage, metrics->>'phase', metrics->>'skipped', metrics->>'gate' "
                       "FROM train_steps ORDER BY step, role").fetchall()
    assert [r[:4] for r in rows] == [(2, "proposer", "sft_proposer", "sft_proposer"), (3, "solver", "sft_solver", "sft_solver"),
                                     (5, "proposer", "rl", "online"), (5, "solver", "rl", "online")]
    (pushed,) = con.execute("SELECT sum(CAST(vars->>'pushed' AS INT)) FROM sessions WHERE stage = 'rl'").fetchone()
    for _, role, _, _, skipped, gate in rows[2:]:
        # the gate is sum(pushed) > 0 over the step's sessions (Alg. 1's D_s != {}): closed exactly
        # when no question was kept for the solver
        assert (skipped == "gate") == (pushed == 0)
        assert (gate == "false") == (pushed == 0)
        version = json.loads((run_dir / "checkpoints" / role / "step-6" / "trainer_state.json").read_text())["version"]
        assert version == (1 if pushed == 0 else 2)  # the sft step, and the rl step only when the gate was open
    assert json.loads((run_dir / "manifest.json").read_text())["run_options"]["profile"] == "online"
