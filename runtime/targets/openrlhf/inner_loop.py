"""The nested schedule's inner loop as a service of the cluster path (SOAR, docs/cluster.md
"Nested schedules"): the outer role trains as the OpenRLHF job; each outer step's
datasets (the outer role's `sample` siblings) go to this service, which trains copies of
the inner role with askspec's local trainer, scores them on the reward questions and
returns R_k per dataset with the promotion decision.

`InnerLoopHost` is the service in a plain object (one process): a LocalTrainer of the
spec with its nested InnerLoop, an engine and a run directory of its own, so the inner
sessions, promotions and nested_events land in the run store as in a local run. R_k is
computed by `InnerLoop.outer_step`, the local schedule's own code. Its state (the
promotion window, the promotions, the inner role's weights) is checkpointed to
`state_dir` after every outer step, and an outer step already answered is answered again
from disk, so a host restarted by Ray (`max_restarts`) resumes where it was.

`start_service` makes the host a Ray actor (one GPU where Ray has them, none on CPU).
In a job (docs/cluster.md, "Nested schedules"), `run_job` is the entry point: it starts
OpenRLHF's train_ppo_ray and, once that has started Ray, the host as a named actor; the
agent finds it by name (`connect`) and asks it once per outer session (`answer`, which
numbers the outer steps in the order the sessions come).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable

from askspec.ir import model as ir

from askspec.runtime.store.layout import write_json_atomic

STATE = "state.json"  # the outer step last answered and its answer
WEIGHTS = "inner.safetensors"  # the inner role's weights after that step (a promotion changes them)
PROMOTED = "promoted"  # the same weights as a Hugging Face folder, for the stages that evaluate the role
KEPT = "kept"  # with `keep = best(accuracy)`: the most accurate promoted student so far, likewise (driver.sh)
RUN = "run"  # the service's run directory (a restarted host appends to it)
NAMESPACE = "askspec"  # the Ray namespace of a job's named service
STATE_ENV = "ASKSPEC_INNER_STATE"  # the service's state_dir in a job (a folder every node sees)


class InnerLoopHost:
    """One outer step per `outer_step` call, state on disk under `state_dir` (module doc)."""

    def __init__(self, experiment: str, *, spec_dir: str, seed: int, runs: str, state_dir: str,
                 resolver_factory: Callable[[ir.Experiment, str], Any], argv: list[str] | None = None) -> None:
        from askspec.ir.canonical import experiment_hash, to_json
        from askspec.runtime.engine.plan import load_dataset
        from askspec.runtime.engine.session import Engine
        from askspec.runtime.engine.stateful import StatefulScorers
        from askspec.runtime.store.writer import RunWriter
        from askspec.runtime.train.trainer import LocalTrainer, StepLog

        exp = ir.Experiment.model_validate_json(experiment)  # JSON: the IR crosses Ray's process boundary as text
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        params = exp.param_values()
        datasets = {d.name: load_dataset(d, spec_dir, seed) for d in exp.datasets}
        # the models the student copies train on: the caller's resolver (the job's entry point
        # passes commands.resolver.local_resolver; a target does not import the commands)
        resolver = resolver_factory(exp, spec_dir)
        self.trainer = LocalTrainer(exp, params=params, datasets=datasets, seed=seed, resolver=resolver,
                                    run_dir=self.state_dir)
        if self.trainer.inner is None or not self.trainer.inner.grounded:
            raise ValueError(f"experiment '{exp.name}': the inner-loop service serves a `nested` schedule with "
                             f"`outer_reward = grounded`; otherwise there is no inner loop to run")
        self.inner = self.trainer.inner
        self.trainer.load_policies(resume_from=None)
        self.answered: dict[str, Any] | None = None
        self._restore()
        argv = argv or ["askspec-inner-loop", str(state_dir)]
        run = self.state_dir / RUN
        if run.exists():  # a restarted host appends to the run directory its first process made
            self.writer = RunWriter.open_for_resume(run.read_text(encoding="utf-8").strip(), argv=argv)
        else:
            roles = {r.name: {"model": r.model, "trained": r.name == self.inner.s.inner} for r in exp.roles}
            self.writer = RunWriter.create(runs, experiment=exp.name, experiment_hash=experiment_hash(exp),
                                           ir_json=to_json(exp), spec_files={}, seed=seed, roles=roles, params=params,
                                           planned_sessions=0, argv=argv)
            run.write_text(str(self.writer.run_dir), encoding="utf-8")
        self.log = StepLog(self.writer)
        self.engine = Engine(self.trainer.engine_experiment(), params=params, datasets=datasets, writer=self.log,
                             resolve_model=self.trainer.resolve, seed=seed, stateful=StatefulScorers(),
                             rollout_roles=frozenset(self.trainer.policies), on_rollout=self.log.rollout)
        self.loop = asyncio.new_event_loop()  # one loop for the host's life: the hf backends' workers are bound to it

    def answer(self, key: str, datasets: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """The next outer step over `datasets`, for the outer session `key` (the agent's):
        steps are numbered in the order sessions come; a key answered last (a call retried
        after a restart) is answered again, not trained twice."""
        if self.answered is not None and self.answered.get("key") == key:
            return self.answered["answer"]
        step = (int(self.answered["step"]) if self.answered is not None else 0) + 1
        return self.outer_step(step, datasets, key=key)

    def outer_step(self, step: int, datasets: list[list[dict[str, Any]]], key: str | None = None) -> dict[str, Any]:
        """R_k per dataset (`outer_rewards`) and the decision for outer step `step` over
        `datasets` (each the items of one dataset, as datasets_of makes them); an outer
        step answered before (a retried call after a restart) is answered the same."""
        from askspec.runtime.train.nested import Dataset

        if self.answered is not None and self.answered["step"] == step:
            return self.answered["answer"]
        if self.answered is not None and step <= self.answered["step"]:
            raise ValueError(f"outer step {step} was asked after step {self.answered['step']}; the inner loop's "
                             f"state is past it")
        sets = [Dataset(k, list(items), []) for k, items in enumerate(datasets, 1)]
        summary = self.loop.run_until_complete(
            self.inner.outer_step(step, self.index0(step), self.engine, self.log, sets))
        answer = {**self.trainer.jsonable(summary), "step": step, "promotions": list(self.inner.state.promotions)}
        self._save(step, answer, key)
        self.writer.flush()
        return answer

    def index0(self, step: int) -> int:
        """The first session index of outer step `step`'s inner sessions (each step owns a range)."""
        return (step - 1) * self.inner.max_sessions()

    def close(self) -> None:
        self.writer.close()
        self.loop.close()

    # -- state ---------------------------------------------------------------------------------

    def _save(self, step: int, answer: dict[str, Any], key: str | None = None) -> None:
        from askspec.runtime.train.nested import _save_weights

        student = self.trainer.policies[self.inner.s.inner]
        if answer.get("promoted"):  # the weights change only by a promotion
            _save_weights(student.state(), self.state_dir / f"{WEIGHTS}.tmp")
            (self.state_dir / f"{WEIGHTS}.tmp").replace(self.state_dir / WEIGHTS)
            # the promoted role as vLLM and OpenRLHF load it (driver.sh: the role's weights after the RL stage)
            student.save(self.state_dir / PROMOTED, step, {}, with_optimizer=False)
            best = self.inner.state.best
            if best is not None and best.get("step") == step:  # keep = best(accuracy): this one is kept
                student.save(self.state_dir / KEPT, step, {}, with_optimizer=False)
        self.inner.save(self.state_dir, step)
        write_json_atomic(self.state_dir / STATE, {"step": step, "key": key, "answer": answer})
        self.answered = {"step": step, "key": key, "answer": answer}

    def _restore(self) -> None:
        from askspec.runtime.train.nested import _load_weights

        path = self.state_dir / STATE
        if not path.exists():
            return
        self.answered = json.loads(path.read_text(encoding="utf-8"))
        assert self.answered is not None
        self.inner.restore(self.state_dir, int(self.answered["step"]))
        if (self.state_dir / WEIGHTS).exists():
            self.trainer.policies[self.inner.s.inner].take_weights(_load_weights(self.state_dir / WEIGHTS))


def start_service(experiment: ir.Experiment, *, spec_dir: str, seed: int, runs: str, state_dir: str,
                  resolver_factory: Callable[[ir.Experiment, str], Any], max_restarts: int = 3,
                  name: str | None = None) -> Any:
    """The host as a Ray actor (Ray must be initialised): one GPU when the cluster has
    them, else CPU; restarted up to `max_restarts` times, its calls retried, resuming
    from `state_dir`. Call it as `ray.get(actor.outer_step.remote(step, datasets))`."""
    import ray

    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    actor = ray.remote(num_gpus=gpus, max_restarts=max_restarts, max_task_retries=max_restarts)(InnerLoopHost)
    # named: the agents find it (`connect`); owned by the caller, it ends with the job's driver
    options = {"name": name, "namespace": NAMESPACE} if name else {}
    return actor.options(**options).remote(experiment.model_dump_json(), spec_dir=spec_dir, seed=seed, runs=runs,
                                           state_dir=state_dir, resolver_factory=resolver_factory)


class Service:
    """The agent's side of a job's service: `await answer(key, datasets)` on the named actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def answer(self, key: str, datasets: list[list[dict[str, Any]]]) -> dict[str, Any]:
        return await self.actor.answer.remote(key, datasets)


def connect(name: str) -> Service:
    """The job's service (run_job started it in the job's Ray cluster), found by name."""
    import ray

    return Service(ray.get_actor(name, namespace=NAMESPACE))


def run_job(job_dir: str | Path, resolver_factory: Callable[[ir.Experiment, str], Any], entry: str) -> Any:
    """A job's entry point (its askspec_nested.py): `python3 -m ENTRY` (OpenRLHF's
    train_ppo_ray, or askspec_ext's wrapper of it) as `__main__`, with the service started
    as the named actor job.json's `inner_loop.service` once OpenRLHF's own `ray.init`
    has run (at once when Ray is up already), so OpenRLHF starts Ray as it always does.
    The service's state goes to $ASKSPEC_INNER_STATE and its run directory to
    $ASKSPEC_RUNS (folders every node sees). Returns the service's handle (the actor
    lives while its owner holds one)."""
    import os
    import runpy

    import ray

    job_dir = Path(job_dir)
    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    exp = ir.Experiment.model_validate(job["experiment"])
    state_dir = os.environ.get(STATE_ENV) or str(job_dir / "inner-loop")
    runs = os.environ.get("ASKSPEC_RUNS") or str(job_dir / "runs")
    original = ray.init
    started: list[Any] = []

    def start() -> None:
        if not started:  # the handle is kept: an owned actor lives while its owner holds it
            started.append(start_service(exp, spec_dir=str(job_dir / "spec"), seed=int(job["seed"]), runs=runs,
                                         state_dir=state_dir, resolver_factory=resolver_factory,
                                         name=job["inner_loop"]["service"]))

    def init(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        start()
        return out

    if ray.is_initialized():  # OpenRLHF's train() then leaves ray.init alone
        start()
    ray.init = init
    try:
        runpy.run_module(entry, run_name="__main__", alter_sys=True)
    finally:
        ray.init = original
    return started[0] if started else None
