"""The nested schedule's inner-loop service (targets/openrlhf/inner_loop.py) under Ray on
CPU against the local nested schedule (runtime/train/nested.py), on the tiny random Llama
of tests/conftest.py with tests/train/specs/tiny_nested.ask: 2 datasets x 2 copies x 2
inner steps, 2 outer steps, the same seed. The service must return the R_k and the
promotions the local schedule computes, also after Ray restarted it between the steps,
when started by the job's entry point and called as the job's agents call it (found by
name, one outer step per session key), whatever the size of its pool of workers (2, then
1: the copies' seeds follow (step, dataset, copy), not the worker that trains them)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from askspec.lang.compiler import compile_file
from askspec.runtime.commands.options import RunOptions
from askspec.runtime.commands.resolver import ModelResolver
from askspec.runtime.engine.plan import load_dataset
from askspec.runtime.store.views import open_store
from askspec.runtime.store.writer import RunWriter
from askspec.runtime.train.batch import SessionRecord
from askspec.runtime.train.nested import datasets_of
from askspec.runtime.train.trainer import LocalTrainer
from askspec.runtime.train.steplog import StepLog

pytestmark = [pytest.mark.slow, pytest.mark.multicore]  # the service and its two workers on a local Ray

ray = pytest.importorskip("ray")

SPEC = Path(__file__).parents[1] / "train" / "specs" / "tiny_nested.ask"
SEED = 5


@pytest.fixture(scope="module")
def ray_cpu():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def exp(tiny_model):
    res = compile_file(str(SPEC), {"weights": f'"{tiny_model}"'})
    assert res.ok, res.diagnostics
    return res.ir


def outer_sessions(step: int, parsed: dict) -> list[SessionRecord]:
    """One teach session of outer step `step`: 2 `sample 4 ask teacher` calls (2 datasets)."""
    sid = f"outer-{step}"
    s = SessionRecord(sid, None, status="ok", book={})
    for t in range(8):
        s.rollouts.append({"role": "teacher", "turn_index": t, "sample_key": f"xs{t // 4 + 1}.{t % 4}"})
        a, b = step + t, 2 * t + 1
        parsed[(sid, t)] = {"text": f"What is {a}+{b}? \\boxed{{{a + b}}}", "question": f"{a}+{b}?", "answer": str(a + b)}
    return [s]


def local_schedule(exp, tmp_path: Path) -> list[dict]:
    """The local nested schedule's InnerLoop.run for outer steps 1 and 2, with what it wrote."""
    spec_dir = str(SPEC.parent)
    t = LocalTrainer(exp, params=exp.param_values(), datasets={d.name: load_dataset(d, spec_dir, SEED)
                                                                 for d in exp.datasets},
                     seed=SEED, resolver=ModelResolver(exp, RunOptions(file=str(SPEC)), spec_dir), run_dir=tmp_path)
    t.load_policies(resume_from=None)
    from askspec.ir.canonical import experiment_hash, to_json
    from askspec.runtime.engine.session import Engine
    from askspec.runtime.engine.stateful import StatefulScorers

    writer = RunWriter.create(tmp_path / "runs", experiment=exp.name, experiment_hash=experiment_hash(exp),
                              ir_json=to_json(exp), spec_files={}, seed=SEED, roles={}, params={}, planned_sessions=0,
                              argv=["test"])
    log = StepLog(writer)
    engine = Engine(t.engine_experiment(), params=t.params, datasets=t.datasets, writer=log, resolve_model=t.resolve,
                    seed=SEED, stateful=StatefulScorers(), rollout_roles=frozenset(t.policies), on_rollout=log.rollout)
    out = []
    loop = asyncio.new_event_loop()
    try:
        for step in (1, 2):
            log.reset()
            sessions = outer_sessions(step, log.parsed)
            datasets = [d.items for d in datasets_of(sessions, log.parsed, "teacher")]
            summary = loop.run_until_complete(t.inner.run(step, (step - 1) * t.inner.max_sessions(), engine, log,
                                                          sessions))
            out.append({"datasets": datasets, "summary": summary, "promotions": list(t.inner.state.promotions),
                        "weights": {k: v.clone() for k, v in t.policies["student"].state().items()}})
    finally:
        loop.close()
        writer.close()
    return out


def test_the_service_returns_the_local_schedules_rewards_and_promotions(ray_cpu, exp, tmp_path, tiny_model,
                                                                        monkeypatch):
    from askspec.runtime.commands.resolver import local_resolver
    from askspec.runtime.targets.openrlhf.generate import compile_job
    from askspec.runtime.targets.openrlhf.inner_loop import connect, run_job

    local = local_schedule(exp, tmp_path / "local")
    assert [len(d) for d in local[0]["datasets"]] == [4, 4]
    # the spec's OpenRLHF job, started by its entry point (askspec_nested.py's run_job) with a
    # stand-in for OpenRLHF's train_ppo_ray that only starts Ray, as train() does first
    res = compile_file(str(SPEC), {"weights": f'"{tiny_model}"'})
    assert compile_job(res, str(SPEC), str(tmp_path / "job"), {}) == 0
    job = json.loads((tmp_path / "job" / "job.json").read_text())
    (tmp_path / "fake_train_ppo_ray.py").write_text("import ray\nray.init(ignore_reinit_error=True)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    state = tmp_path / "service"
    monkeypatch.setenv("ASKSPEC_INNER_STATE", str(state))
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "service-runs"))
    monkeypatch.setenv("ASKSPEC_INNER_WORKERS", "2")
    started = run_job(tmp_path / "job", local_resolver, "fake_train_ppo_ray")
    assert started is not None and len(started.workers) == 2  # the pool, owned here: it outlives a restarted host
    actor = started.host
    service = connect(job["inner_loop"]["service"])  # as the job's agents find it: by name

    def answer(key: str, datasets: list) -> dict:
        """An agent's call for its outer session `key` (the service numbers the steps)."""
        return asyncio.run(asyncio.wait_for(service.answer(key, datasets), 600))

    got = [answer("session-a", local[0]["datasets"])]
    # Ray restarts the service (max_restarts): it resumes from its state, not from the spec's weights
    ray.kill(actor, no_restart=False)
    got.append(answer("session-b", local[1]["datasets"]))
    again = answer("session-b", local[1]["datasets"])  # a retried call: the same answer, not a third step
    for mine, theirs in zip(got, local):
        assert mine["outer_rewards"] == theirs["summary"]["outer_rewards"]
        assert len(mine["outer_rewards"]) == 2
        assert (mine["promoted"], mine["moving_average"], mine["baseline_accuracy"]) == (
            theirs["summary"]["promoted"], theirs["summary"]["moving_average"], theirs["summary"]["baseline_accuracy"])
        assert mine["promotions"] == json.loads(json.dumps(theirs["promotions"]))
    assert [p["step"] for p in got[1]["promotions"]] == [1, 2]  # threshold -1: every step promotes
    assert [g["step"] for g in got] == [1, 2]
    assert again == got[1]
    # the restarted service trained step 2's copies from step 1's promoted weights, as the local schedule did
    from safetensors.torch import load_file

    weights = load_file(str(state / "inner.safetensors"))
    assert weights.keys() == local[1]["weights"].keys()
    assert all(torch.equal(weights[k], local[1]["weights"][k]) for k in weights)
    assert not all(torch.equal(local[0]["weights"][k], local[1]["weights"][k]) for k in weights)
    ray.get(actor.close.remote())
    # the service's run store holds the same nested events as the local run's, per outer step
    # (the inner steps' losses too: the workers return them); the copies' sessions are in
    # the two workers' run directories
    service = (state / "run").read_text().strip()
    workers = [(state / f"run-worker-{i}").read_text().strip() for i in (0, 1)]
    assert sorted(str(p) for p in (tmp_path / "service-runs").iterdir() if p.is_dir()) == sorted([service, *workers])
    (local_run,) = [p for p in (tmp_path / "local" / "runs").iterdir() if p.is_dir()]
    q = "SELECT step, event, dataset, copy, inner_step, value FROM nested_events ORDER BY seq"
    theirs = open_store(local_run).execute(q).fetchall()
    mine = open_store(Path(service)).execute(q).fetchall()
    assert mine == theirs
    def session_ids(run: Path | str) -> list[str]:
        return [r[0] for r in open_store(Path(run)).execute("SELECT session_id FROM sessions").fetchall()]

    copies = [session_ids(w) for w in workers]
    assert all(copies)  # both workers trained copies: the sessions are the local run's, numbered alike
    assert sorted(session_ids(service) + copies[0] + copies[1]) == sorted(session_ids(local_run))
    # a pool of 1 (a host in this process, its one worker a Ray actor) answers as the pool of 2
    from askspec.runtime.targets.openrlhf.inner_loop import InnerLoopHost

    one = InnerLoopHost(exp.model_dump_json(), spec_dir=str(SPEC.parent), seed=SEED, runs=str(tmp_path / "one-runs"),
                        state_dir=str(tmp_path / "one"), resolver_factory=local_resolver, workers=1)
    try:
        for step, mine in enumerate(got, 1):
            assert one.outer_step(step, local[step - 1]["datasets"]) == mine
        assert len(one.pool) == 1
    finally:
        one.close()
