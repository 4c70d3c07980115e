"""PasoDoble offline (tests/targets/specs/pasodoble_offline.ask: the real spec's games and
schedule in small), two iterations, end to end on CPU through the job's driver.sh, against
the local alternating run of the same spec and seed (#22, "Acceptance").

OpenRLHF's launch is openrlhf_standin.py (test scaffolding): a `ray` on PATH that trains
the phase with askspec's local trainer on the tiny model, its sessions recorded as the
phase's agents record them, its weights written to `--ckpt.output_dir`; the frozen servers
are a serve_frozen.sh that hands the stand-in the weights driver.sh gives it. Phase 3
(iteration 2's proposer) is killed with SIGKILL once its sessions are recorded, and the
driver run again: it resumes at phase 3. Then the buffer events (the job's run store),
the checkpoints and the phase order equal the local run's.

Slow: every phase is a fresh Python process that imports torch and transformers (five
launches and the driver's phase_data calls)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.runtime.store.views import open_store
from askspec.runtime.targets.openrlhf import phase_data

pytestmark = [pytest.mark.slow, pytest.mark.multicore]  # driver.sh with its frozen servers and launches

HERE = Path(__file__).parent
SERVE_FROZEN = '''#!/usr/bin/env bash
# the frozen roles' servers of the test: the weights driver.sh hands them, for the stand-in
[ "${1:-}" = "stop" ] && exit 0
cd "$(dirname "$0")"
exec "$PYTHON" -c 'import json, os; json.dump({k: v for k, v in os.environ.items() if k.startswith("CKPT_")}, open("frozen.json", "w"))'
'''
# local global step -> (iteration, phase): one proposer step, then one solver step, twice
SCHEDULE = {1: (1, "proposer"), 2: (1, "solver"), 3: (2, "proposer"), 4: (2, "solver")}
EVENT_FIELDS = "step, phase, event, item, value, reason, score, best, replays"


@pytest.fixture(scope="module")
def spec(tmp_path_factory, tiny_model) -> Path:
    text = (HERE / "specs" / "pasodoble_offline.ask").read_text()
    assert text.count('hf("smollm2-135m-instruct")') == 1
    path = tmp_path_factory.mktemp("paso_spec") / "pasodoble_offline.ask"
    path.write_text(text.replace('hf("smollm2-135m-instruct")', f'hf("{tiny_model}")'))
    return path


@pytest.fixture(scope="module")
def local(spec, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("paso_local")
    assert main(["run", str(spec), "--out", str(out), "--quiet"]) == 0
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def _drive(job: Path, tmp: Path, kill_at: int | None = None) -> tuple[int, list[list]]:
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "ray").write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'openrlhf_standin.py'} \"$@\"\n")
    (stubs / "ray").chmod(0o755)
    log = tmp / "launches.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "LAUNCH_LOG": str(log), "PYTHON": sys.executable,
           "PHASE_DATA": f"{sys.executable} -m askspec.runtime.targets.openrlhf.phase_data", "ACTOR_GPUS": "2"}
    if kill_at is not None:
        env["KILL_AT"] = str(kill_at)
    # its own session: the stand-in's SIGKILL takes driver.sh's process group, not pytest
    done = subprocess.run(["bash", str(job / "driver.sh")], env=env, cwd=tmp, timeout=600, start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert kill_at is not None or done.returncode == 0, done.stderr[-3000:]
    return done.returncode, [json.loads(x)[:2] for x in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(scope="module")
def job(spec, tmp_path_factory) -> tuple[Path, list, list]:
    tmp = tmp_path_factory.mktemp("paso_job")
    job = tmp / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(job)]) == 0
    for serve in job.glob("phase-*/serve_frozen.sh"):
        serve.write_text(SERVE_FROZEN)
    rc, killed = _drive(job, tmp, kill_at=3)
    assert rc == -9, "phase 3 was to be killed"
    _, resumed = _drive(job, tmp)
    return job, killed, resumed


def test_a_kill_during_phase_3_resumes_at_phase_3(job) -> None:
    job, killed, resumed = job
    ckpt = job / "ckpt"
    assert [p for p, _ in killed] == ["phase-1-proposer", "phase-2-solver", "phase-1-proposer"]
    assert resumed == [["phase-1-proposer", f"{ckpt}/iter-1/proposer"], ["phase-2-solver", f"{ckpt}/iter-1/solver"]]
    assert killed[2][1] == f"{ckpt}/iter-1/proposer"  # the killed attempt started from the same weights
    state = json.loads((job / phase_data.STATE).read_text())
    assert state["committed"] == ["iter-1-proposer", "iter-1-solver", "iter-2-proposer", "iter-2-solver"]
    # the killed attempt's sessions were set aside, never committed
    assert len(list((job / "runs").glob("iter-2-proposer.interrupted-*"))) == 1
    for it in (1, 2):
        for role in ("proposer", "solver"):
            assert (ckpt / f"iter-{it}" / role / "model.safetensors").exists()


def test_buffer_events_equal_the_local_runs(job, local) -> None:
    job, _, _ = job
    want = open_store(local).execute(f"SELECT {EVENT_FIELDS} FROM buffer_events ORDER BY step, seq").fetchall()
    got = open_store(job / phase_data.STORE).execute(
        f"SELECT {EVENT_FIELDS} FROM buffer_events ORDER BY step, seq").fetchall()
    assert got == want
    kinds = {row[2] for row in want}
    assert {"push", "replay", "evict"} <= kinds, f"the spec must push, replay and evict: {kinds}"
    assert all(SCHEDULE[row[0]][1] == row[1] for row in want)
    state = json.loads((job / phase_data.STATE).read_text())
    local_state = json.loads((local / "checkpoints" / "buffers" / "step-4.json").read_text())
    assert state["buffers"] == local_state


def test_checkpoints_and_phase_order_equal_the_local_runs(job, local) -> None:
    from safetensors.torch import load_file

    job, _, resumed = job
    con = open_store(local)
    order = con.execute("SELECT step, role, CAST(metrics->>'iteration' AS INT), metrics->>'phase', skipped "
                        "FROM train_steps ORDER BY step").fetchall()
    assert [(s, it, ph) for s, _, it, ph, _ in order] == [(s, *SCHEDULE[s]) for s in SCHEDULE]
    assert all(skipped is None for *_, skipped in order)  # every step updated its role
    # the solver's weights at step 1 are the initial ones (it has not trained yet)
    initial = load_file(str(local / "checkpoints" / "solver" / "step-1" / "model.safetensors"))
    for step, role, it, _, _ in order:
        mine = load_file(str(job / "ckpt" / f"iter-{it}" / role / "model.safetensors"))
        theirs = load_file(str(local / "checkpoints" / role / f"step-{step}" / "model.safetensors"))
        assert mine.keys() == theirs.keys()
        for name in theirs:
            assert mine[name].equal(theirs[name]), (step, role, name)
        assert any(not mine[k].equal(initial[k]) for k in mine), f"step {step} left {role}'s weights as they were"
