"""The nested schedule's inner loop as a service of the cluster path (SOAR, docs/cluster.md
"Nested schedules"): the outer role trains as the OpenRLHF job; each outer step's
datasets (the outer role's `sample` siblings) go to this service, which trains copies of
the inner role with askspec's local trainer, scores them on the reward questions and
returns R_k per dataset with the promotion decision.

`InnerLoopHost` is the service in a plain object (one process): a LocalTrainer of the
spec with its nested InnerLoop, an engine and a run directory of its own, so the baseline
sessions, promotions and nested_events land in a run store as in a local run. R_k is
computed by `InnerLoop.outer_step`, the local schedule's own code. Its state (the
promotion window, the promotions, the inner role's weights) is checkpointed to
`state_dir` after every outer step, and an outer step already answered is answered again
from disk, so a host restarted by Ray (`max_restarts`) resumes where it was.

The copies of an outer step (K datasets x C copies) train on a pool of Ray worker actors
(`InnerWorker`: each a LocalTrainer, an engine and a run directory of its own, calling
`InnerLoop.train_copy` as the local schedule does): `workers` of them
(`$ASKSPEC_INNER_WORKERS` in a job, one on CPU: started with the service by its caller,
so they outlive a restarted host; else one per GPU Ray has free when the first outer
step comes, started by the host then). The host computes the baseline, gathers the
copies in (k, copy) order and decides as the local schedule does; a copy's seeds and
session numbers follow (step, k, copy), so the answer does not depend on the pool's size.
A host outside Ray trains the copies itself, one after the other.

`start_service` makes the host a Ray actor (one GPU where Ray has them, none on CPU).
In a job (docs/cluster.md, "Nested schedules"), `run_job` is the entry point: it starts
OpenRLHF's train_ppo_ray and, once that has started Ray, the host as a named actor; the
agent finds it by name (`connect`) and asks it once per outer session (`answer`, which
numbers the outer steps in the order the sessions come).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from askspec.ir import model as ir

from askspec.runtime.store.layout import write_json_atomic
from askspec.runtime.train.promotions import STATE
from askspec.runtime.targets.openrlhf.jobfile import FILE, read_phase_job

WEIGHTS = "inner.safetensors"  # the inner role's weights after that step (a promotion changes them)
PROMOTED = "promoted"  # the same weights as a Hugging Face folder, for the stages that evaluate the role
KEPT = "kept"  # with `keep = best(accuracy)`: the most accurate promoted student so far, likewise (driver.sh)
RUN = "run"  # the service's run directory (a restarted host appends to it)
NAMESPACE = "askspec"  # the Ray namespace of a job's named service
STATE_ENV = "ASKSPEC_INNER_STATE"  # the service's state_dir in a job (a folder every node sees)
WORKERS_ENV = "ASKSPEC_INNER_WORKERS"  # the pool's size in a job (default: module doc)


def _build(experiment: str, spec_dir: str, seed: int, state_dir: Path,
           resolver_factory: Callable[[ir.Experiment, str], Any]) -> tuple[ir.Experiment, dict, dict, Any]:
    """The experiment, its parameters and data sets, and a LocalTrainer of it with its
    policies loaded (the host's and every worker's: the same spec, seed and models)."""
    from askspec.runtime.engine.plan import load_dataset
    from askspec.runtime.train.trainer import LocalTrainer

    exp = ir.Experiment.model_validate_json(experiment)  # JSON: the IR crosses Ray's process boundary as text
    params = exp.param_values()
    datasets = {d.name: load_dataset(d, spec_dir, seed) for d in exp.datasets}
    # the models the student copies train on: the caller's resolver (the job's entry point
    # passes commands.resolver.local_resolver; a target does not import the commands)
    trainer = LocalTrainer(exp, params=params, datasets=datasets, seed=seed, resolver=resolver_factory(exp, spec_dir),
                           run_dir=state_dir)
    if trainer.inner is None or not trainer.inner.grounded:
        raise ValueError(f"experiment '{exp.name}': the inner-loop service serves a `nested` schedule with "
                         f"`outer_reward = grounded`; otherwise there is no inner loop to run")
    trainer.load_policies(resume_from=None)
    return exp, params, datasets, trainer


def _engine(trainer: Any, params: dict, datasets: dict, log: Any, seed: int) -> Any:
    from askspec.runtime.engine.session import Engine
    from askspec.runtime.engine.stateful import StatefulScorers

    return Engine(trainer.engine_experiment(), params=params, datasets=datasets, writer=log,
                  resolve_model=trainer.resolve, seed=seed, stateful=StatefulScorers(),
                  rollout_roles=frozenset(trainer.policies), on_rollout=log.rollout)


def _writer(exp: ir.Experiment, pointer: Path, runs: str, seed: int, params: dict, inner: str,
            argv: list[str]) -> Any:
    """A run directory of the caller's own under `runs`; `pointer` names it, so a process
    Ray restarts appends to the one its first process made."""
    from askspec.ir.canonical import experiment_hash, to_json
    from askspec.runtime.store.writer import RunWriter

    if pointer.exists():
        return RunWriter.open_for_resume(pointer.read_text(encoding="utf-8").strip(), argv=argv)
    roles = {r.name: {"model": r.model, "trained": r.name == inner} for r in exp.roles}
    writer = RunWriter.create(runs, experiment=exp.name, experiment_hash=experiment_hash(exp), ir_json=to_json(exp),
                              spec_files={}, seed=seed, roles=roles, params=params, planned_sessions=0, argv=argv)
    pointer.write_text(str(writer.run_dir), encoding="utf-8")
    return writer


class InnerLoopHost:
    """One outer step per `outer_step` call, state on disk under `state_dir` (module doc)."""

    def __init__(self, experiment: str, *, spec_dir: str, seed: int, runs: str, state_dir: str,
                 resolver_factory: Callable[[ir.Experiment, str], Any], argv: list[str] | None = None,
                 workers: int | None = None, pool: list[Any] | None = None) -> None:
        from askspec.runtime.train.steplog import StepLog

        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        exp, params, datasets, self.trainer = _build(experiment, spec_dir, seed, self.state_dir, resolver_factory)
        self.inner = self.trainer.inner
        self.answered: dict[str, Any] | None = None
        self._restore()
        argv = argv or ["askspec-inner-loop", str(state_dir)]
        self.writer = _writer(exp, self.state_dir / RUN, runs, seed, params, self.inner.s.inner, argv)
        self.log = StepLog(self.writer)
        self.engine = _engine(self.trainer, params, datasets, self.log, seed)
        self.loop = asyncio.new_event_loop()  # one loop for the host's life: the hf backends' workers are bound to it
        if workers is not None and workers < 1:
            raise ValueError(f"the inner-loop service's pool needs at least one worker, got {workers} "
                             f"(${WORKERS_ENV})")
        self.workers = workers
        # the worker actors: the caller's (start_service), or the host's own, started with the first outer step
        self.pool: list[Any] = list(pool or [])
        self._worker_args = dict(experiment=experiment, spec_dir=spec_dir, seed=seed, runs=runs, state_dir=state_dir,
                                 resolver_factory=resolver_factory)

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
            self.inner.outer_step(step, self.index0(step), self.engine, self.log, sets, train=self._pool_trainer()))
        from askspec.runtime.train.steplog import jsonable

        answer = {**jsonable(summary), "step": step, "promotions": list(self.inner.state.promotions)}
        self._save(step, answer, key)
        self.writer.flush()
        return answer

    def _pool_trainer(self) -> Any:
        """The inner loop's CopyTrainer on the pool: copy n of the step goes to worker n mod
        the pool's size (every copy is as long), the student's weights as of the last
        promotion (the file `_save` wrote: the workers load it when it changes). None (the
        host trains the copies itself, one after the other) for a host outside Ray."""
        import ray

        if not ray.is_initialized():
            return None
        if not self.pool:
            self.pool = start_workers(self.workers or default_workers(), **self._worker_args)
        last = self.inner.state.promotions[-1]["step"] if self.inner.state.promotions else None
        weights = str(self.state_dir / WEIGHTS) if last is not None else None
        order = [0]

        async def train(step: int, ds: Any, j: int, steps: int, questions: list, index0: int) -> Any:
            from askspec.runtime.train.nested import CopyResult

            worker = self.pool[order[0] % len(self.pool)]
            order[0] += 1
            out = await worker.train.remote(step, ds.k, list(ds.items), j, steps, questions, index0, last, weights)
            return CopyResult(**out)

        return train

    def index0(self, step: int) -> int:
        """The first session index of outer step `step`'s inner sessions (each step owns a range)."""
        return (step - 1) * self.inner.max_sessions()

    def close(self) -> None:
        import ray

        for worker in self.pool:
            ray.get(worker.close.remote())
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


class InnerWorker:
    """A worker of the service's pool: a LocalTrainer of the spec (the host's models, seed
    and data), an engine and a run directory of its own (its copies' sessions), training
    the copies it is given with `InnerLoop.train_copy`, the local schedule's code."""

    def __init__(self, experiment: str, *, spec_dir: str, seed: int, runs: str, state_dir: str,
                 resolver_factory: Callable[[ir.Experiment, str], Any], index: int) -> None:
        from askspec.runtime.train.steplog import StepLog

        state = Path(state_dir)
        exp, params, datasets, self.trainer = _build(experiment, spec_dir, seed, state, resolver_factory)
        self.inner = self.trainer.inner
        self.writer = _writer(exp, state / f"{RUN}-worker-{index}", runs, seed, params, self.inner.s.inner,
                              ["askspec-inner-loop-worker", str(index), state_dir])
        self.log = StepLog(self.writer)
        self.engine = _engine(self.trainer, params, datasets, self.log, seed)
        self.loop = asyncio.new_event_loop()
        self.promoted: int | None = None  # the outer step whose promotion the student's weights are (None: the spec's)

    def train(self, step: int, k: int, items: list[dict[str, Any]], j: int, steps: int, questions: list,
              index0: int, promoted: int | None, weights: str | None) -> dict[str, Any]:
        """Copy j of dataset k of outer step `step`, forked from the student promoted at step
        `promoted` (its weights in the file `weights`), as InnerLoop.train_copy gives it."""
        import dataclasses

        from askspec.runtime.train.nested import Dataset, _load_weights

        if promoted != self.promoted:
            student = self.trainer.policies[self.inner.s.inner]
            if weights is None:  # nothing promoted yet (a host that started over): the spec's weights
                student.reset()
            else:
                student.take_weights(_load_weights(Path(weights)))
            self.promoted = promoted
        out = self.loop.run_until_complete(self.inner.train_copy(step, Dataset(k, items, []), j, steps, questions,
                                                                 index0, self.engine, self.log))
        self.writer.flush()
        return dataclasses.asdict(out)

    def close(self) -> None:
        self.writer.close()
        self.loop.close()


def default_workers() -> int:
    """The pool's size without $ASKSPEC_INNER_WORKERS: the GPUs Ray has free (asked once
    the job's own actors and engines hold theirs: at the first outer step), one at least;
    one on CPU."""
    import ray

    if ray.cluster_resources().get("GPU", 0) < 1:
        return 1
    return max(1, int(ray.available_resources().get("GPU", 0)))


def start_workers(n: int, **kwargs: Any) -> list[Any]:
    """`n` InnerWorker actors (one GPU each where Ray has GPUs), restarted like the host."""
    import ray

    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    # no CPU asked: the pool's size is the caller's (Ray would hold a CPU per actor, and a
    # small CPU cluster would leave workers unplaced while the host waits for them)
    actor = ray.remote(num_gpus=gpus, num_cpus=0, max_restarts=3, max_task_retries=3)(InnerWorker)
    return [actor.remote(**kwargs, index=i) for i in range(n)]


@dataclass
class Started:
    """A started service: the host actor and the pool its caller owns (empty: the host
    starts its own). Both live while the caller holds this."""

    host: Any
    workers: list[Any]


def start_service(experiment: ir.Experiment, *, spec_dir: str, seed: int, runs: str, state_dir: str,
                  resolver_factory: Callable[[ir.Experiment, str], Any], max_restarts: int = 3,
                  name: str | None = None, workers: int | None = None) -> Started:
    """The host as a Ray actor (Ray must be initialised): one GPU when the cluster has
    them, else CPU; restarted up to `max_restarts` times, its calls retried, resuming
    from `state_dir`. Its pool of `workers` (one on a CPU-only cluster): started here,
    owned by the caller, so a restarted host finds its workers with their models loaded;
    without `workers`, on a GPU cluster, the host starts default_workers() itself with the
    first outer step (the GPUs free then), and a restarted host starts them again. Call
    it as `ray.get(started.host.outer_step.remote(step, datasets))`."""
    import ray

    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    n = workers if workers is not None else (None if gpus else 1)
    if n is not None and n < 1:
        raise ValueError(f"the inner-loop service's pool needs at least one worker, got {n} (${WORKERS_ENV})")
    pool = start_workers(n, experiment=experiment.model_dump_json(), spec_dir=spec_dir, seed=seed, runs=runs,
                         state_dir=state_dir, resolver_factory=resolver_factory) if n is not None else None
    actor = ray.remote(num_gpus=gpus, max_restarts=max_restarts, max_task_retries=max_restarts)(InnerLoopHost)
    # named: the agents find it (`connect`); owned by the caller, it ends with the job's driver
    options = {"name": name, "namespace": NAMESPACE} if name else {}
    host = actor.options(**options).remote(experiment.model_dump_json(), spec_dir=spec_dir, seed=seed, runs=runs,
                                           state_dir=state_dir, resolver_factory=resolver_factory, workers=workers,
                                           pool=pool)
    return Started(host, pool or [])


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


def run_job(job_dir: str | Path, resolver_factory: Callable[[ir.Experiment, str], Any],
            entry: str) -> Started | None:
    """A job's entry point (its askspec_nested.py): `python3 -m ENTRY` (OpenRLHF's
    train_ppo_ray, or askspec_ext's wrapper of it) as `__main__`, with the service started
    as the named actor job.json's `inner_loop.service` once OpenRLHF's own `ray.init`
    has run (at once when Ray is up already), so OpenRLHF starts Ray as it always does.
    The service's state goes to $ASKSPEC_INNER_STATE and its run directory to
    $ASKSPEC_RUNS (folders every node sees); its pool has $ASKSPEC_INNER_WORKERS workers.
    Returns the started service (its actors live while their owner holds them)."""
    import os
    import runpy

    import ray

    job_dir = Path(job_dir)
    job = read_phase_job(job_dir)
    exp = job.ir()
    if job.inner_loop is None:
        raise SystemExit(f"{job_dir / FILE} has no inner-loop service: this phase's job does not start one")
    service = job.inner_loop.service
    state_dir = os.environ.get(STATE_ENV) or str(job_dir / "inner-loop")
    runs = os.environ.get("ASKSPEC_RUNS") or str(job_dir / "runs")
    workers = os.environ.get(WORKERS_ENV)
    if workers is not None and not workers.strip().isdigit():
        raise SystemExit(f"${WORKERS_ENV} is '{workers}': set it to the number of workers that train the student "
                         f"copies (one GPU each), or unset it for one per free GPU")
    original = ray.init
    started: list[Started] = []

    def start() -> None:
        if not started:  # the handles are kept: an owned actor lives while its owner holds it
            started.append(start_service(exp, spec_dir=str(job_dir / "spec"), seed=job.seed, runs=runs,
                                         state_dir=state_dir, resolver_factory=resolver_factory,
                                         name=service,
                                         workers=int(workers) if workers is not None else None))

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
