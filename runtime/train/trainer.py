"""The training loop behind `askspec run` on a spec with `train` blocks (schedule `online`,
the default: every trained role is updated from every game, every step).

A step plays `batch` sessions (whole groups: a `sample N` game's N, else the train block's
`group` repeats of one game element), walking the games' elements in plan order and
cycling; records each trained role's turns token by token (Parquet rollout shards);
turns the sessions into trajectories, rewards and groups (batch.py); updates every trained
role (policy.py) and writes one `train_steps` event per role. The trained roles' turns
are served by hf backends running the very weights being trained, so the next step
samples from the updated policy; `current(role)` models share them.

Asynchronous rollouts (`max_staleness` ≥ 1, online schedule): step t's update runs in a
worker thread while step t + 1 is played by a copy of the weights from before it, so
rollouts are at most one update stale; each records the version that sampled it and the
update corrects for it (policy.py, losses.py); a stage boundary drains the overlap (a
stage's step runs by the current weights). See `_run_async`.

Resume. Checkpoints are written every `save_every` steps and after the last; a resumed run
(`--resume` after any crash or `kill -9`) reloads the newest complete one (weights and
optimizer) and plays again every step after it, with the same sessions and seeds. The
sessions of a replayed step are new attempts and its `train_steps` events supersede the
earlier ones, so each view shows every step exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from askspec.ir import model as ir
from askspec.ir.plansize import weight_rounds

from askspec.runtime.engine.plan import SessionPlan, bind, replays_buffer
from askspec.runtime.train import schedule
from askspec.runtime.train.checkpoints import BUFFERS, STAGES, CheckpointDamaged, RunCheckpoints
from askspec.runtime.train.config import config_from_ir
from askspec.runtime.train.nested import InnerLoop
from askspec.runtime.train.planner import MAX_REFILL_ROUNDS, Draw, Element, StepPlanner
from askspec.runtime.train.stage_steps import StageState, StageSteps
from askspec.runtime.train.steplog import StepLog, jsonable
from askspec.runtime.train.update import (Metrics, Played, TurnKeys, gate_reason, mismatched_roles, rollout_rows,
                                           update_roles)


class TrainingRefused(Exception):
    """The spec or the options ask for training the local trainer cannot do: one message
    per problem, each with the IR span it is about (None for a command-line option)."""

    def __init__(self, problems: list[tuple[str, ir.Span | None]]) -> None:
        super().__init__("; ".join(m for m, _ in problems))
        self.problems = problems


class TrainingStopped(Exception):
    """The run cannot go on: too many steps with a NaN or infinite advantage, loss or
    gradient (`max_nonfinite_steps`), weights that are no longer finite numbers, or an
    on-policy step whose sampler did not play the trained weights (`on_mismatch = error`).
    The message says which role and steps, and what to do."""


# ---------------------------------------------------------------------------------------
# the trainer


class LocalTrainer:
    """Trains every role of the spec's `train` blocks on the hf backend (see module doc)."""

    def __init__(self, exp: ir.Experiment, *, params: dict[str, Any], datasets: dict[str, list], seed: int,
                 resolver, run_dir: str | os.PathLike[str] | None) -> None:
        self.exp = exp
        self.seed = seed
        self.params = params
        self.resolver = resolver  # commands.run.ModelResolver
        self.run_dir = Path(run_dir or ".")  # set by the run command once the run directory exists
        self.configs = [config_from_ir(t, exp) for t in exp.training]
        self.by_role = {c.role: c for c in self.configs}
        self.gates = {t.role: t.update_when for t in exp.training if t.update_when is not None}
        self.inner: InnerLoop | None = None  # the nested schedule's inner loop
        if exp.schedule is not None and exp.schedule.kind == "nested":
            self.inner = InnerLoop(self, params, dict(datasets))
        self.check(exp)
        self.slots = schedule.slots(exp)
        self.steps = len(self.slots)
        inner_games = self.inner.games() if self.inner is not None else []
        inner_games += [st.options[k] for st in exp.stages if st.kind == "retrain" for k in ("game", "sample")
                        if st.options.get(k)]
        self.games = [g for g in exp.games
                      if g.name in inner_games or any(g.name in s.phase.plain + s.phase.replay for s in self.slots)]
        self.planners: dict[str, StepPlanner] = {}
        self.evaluated: dict[str, list[Element]] = {}  # an evaluate stage's elements
        for ph in {s.phase.name: s.phase for s in self.slots}.values():
            if ph.kind == "evaluate":
                self.evaluated[ph.name] = StepPlanner.elements_of(exp, [g for g in exp.games if g.name in ph.plain], params,
                                                                  dict(datasets))
            elif ph.plain:
                self.planners[ph.name] = StepPlanner(exp, [g for g in exp.games if g.name in ph.plain], params,
                                                     dict(datasets), seed, ph.groups, ph.batch)
        self.planner = next(iter(self.planners.values()), None)  # the first phase's (tests, progress)
        self.sampling: dict[str, list[Element]] = {  # a retrain stage's sample game's elements (its own groups)
            st.name: StepPlanner.elements_of(exp, [self.game_named(st.options["sample"])], params, dict(datasets))
            for st in exp.stages if st.kind == "retrain" and st.options.get("sample")}
        self.stage_state = StageState()
        self.stage_steps = StageSteps(self)
        self._stage_end = {sl.phase.stage: sl.step for sl in self.slots}  # stage -> its last step
        self.index0 = [0]  # per step: its first session index (each step owns a fixed range)
        for sl in self.slots:
            self.index0.append(self.index0[-1] + self.step_sessions(sl))
        self.policies: dict[str, Any] = {}
        self.start_step = 0
        self.datasets = datasets
        self._serving = "trained"  # which weights the trained roles are served by (`serving`)
        self.nonfinite: dict[str, list[int]] = {}  # role -> steps of this process whose update was not finite

    def planner_over(self, games: list[ir.Game], collections: dict[str, list], seed: int, groups: Mapping[str, int],
                     batch: int) -> StepPlanner:
        """A StepPlanner for games over other items than the spec's (a retrain stage's, the
        nested inner loop's), in the given groups and batch (a lowered phase's)."""
        return StepPlanner(self.exp, games, self.params, collections, seed, groups, batch)

    def game_named(self, name: str) -> ir.Game:
        return next(g for g in self.exp.games if g.name == name)

    def step_sessions(self, sl: schedule.Slot) -> int:
        """The most sessions step `sl` plays (a replay plays fewer when its buffer is short)."""
        if sl.phase.kind != "play":
            stage = self.stage_steps.stage(sl)
            if stage.kind == "retrain":
                return sl.phase.batch + (self.stage_steps.sample_sessions(stage) if sl.n == 1 else 0)
            return 0 if stage.kind == "sft" else (len(self.evaluated[sl.phase.name]) * stage.options["samples"]
                                                  * weight_rounds(self.exp, stage))
        n = self.planners[sl.phase.name].sessions_per_step(sl.n) if sl.phase.plain else 0
        for name in sl.phase.replay:
            n += sl.phase.replay_items[name] * sl.phase.groups[name]
        return n + (self.inner.max_sessions() if self.inner is not None else 0)

    # -- what cannot run -------------------------------------------------------------------

    def check(self, exp: ir.Experiment) -> None:
        problems: list[tuple[str, ir.Span | None]] = []
        if self.inner is not None:
            problems += self.inner.problems()
        roles = [c.role for c in self.configs]
        for t, cfg in zip(exp.training, self.configs):
            if roles.count(cfg.role) > 1:
                problems.append((f"role '{cfg.role}' has more than one train block", t.span))
            if cfg.replay is not None:
                problems.append((f"'replay = {cfg.replay}' is not carried out by the local trainer: a game that iterates "
                                 f"over the buffer replays it (schedule alternating); remove the setting", t.span))
        problems += self._staleness_problems(exp)
        trained = {r.name for r in exp.roles if r.trained}
        untrained = sorted(trained - set(roles))
        for name in untrained:
            problems.append((f"role '{name}' is marked 'trained' but has no train block: add `train {name} with ...`, "
                             f"or run with --eval-only", exp.role(name).span))
        if problems:
            raise TrainingRefused(problems)

    def _staleness_problems(self, exp: ir.Experiment) -> list[tuple[str, ir.Span | None]]:
        """Asynchronous rollouts overlap one online step's update with the next step's play;
        what keeps per-step state beside the weights (a buffer, another schedule)
        or trains a role on-policy beside them cannot overlap."""
        lagged = [(t, c) for t, c in zip(exp.training, self.configs) if c.max_staleness > 0]
        if not lagged:
            return []
        t, cfg = lagged[0]
        what = f"'max_staleness = {cfg.max_staleness}' (asynchronous rollouts)"
        out: list[tuple[str, ir.Span | None]] = []
        if exp.schedule is not None and exp.schedule.kind != "online":
            out.append((f"{what} runs with the online schedule only, not '{exp.schedule.kind}': remove the setting",
                        t.span))
        if exp.buffers:
            out.append((f"{what} cannot run with a buffer (its checkpointed contents would include the next "
                        f"step's pushes): remove the setting or the buffer", t.span))
        on_policy = [c.role for c in self.configs if c.max_staleness == 0]
        if on_policy:
            out.append((f"{what}: every trained role's step overlaps the next play, so role(s) "
                        f"{', '.join(on_policy)} would train on stale rollouts too: give every train block "
                        f"max_staleness ≥ 1, or none", t.span))
        return out

    def engine_experiment(self) -> ir.Experiment:
        """The experiment the engine runs: the schedule's games (the trainer plans every
        phase itself, buffer replays included)."""
        return self.exp.model_copy(update={"games": self.games})

    def planned_sessions(self) -> int:
        return self.planner_sessions_before(self.steps)

    def steps_done(self) -> str:
        """The run's training steps for its closing line: all of them, or how many a stage's
        `keep = plateau(...)` left when it stopped the stage early (the later steps of that
        stage are never played)."""
        stopped = self.stage_state.stopped
        left = [sl.step for sl in self.slots if sl.phase.stage in stopped and sl.step > stopped[sl.phase.stage]]
        if not left:
            return f"{self.steps} step(s)"
        why = ", ".join(f"stage {name} stopped at its reward plateau at step {step}" for name, step in stopped.items())
        return f"{self.steps - len(left)} of {self.steps} step(s) ({why})"

    def planner_sessions_before(self, step: int) -> int:
        """Sessions of steps 1..step (at most: a short buffer replays fewer)."""
        return self.index0[step]

    # -- models ----------------------------------------------------------------------------

    def load_policies(self, resume_from: Path | None) -> None:
        """One TrainedPolicy per trained role, from the spec's weights or a checkpoint."""
        from askspec.runtime.backends.base import BackendError
        from askspec.runtime.backends.hf import HFBackend
        from askspec.runtime.train.policy import TrainedPolicy

        problems = []
        if resume_from is not None:
            problem = self.resume_problem(self.start_step)
            if problem is not None:
                raise CheckpointDamaged(problem)
        for t, cfg in zip(self.exp.training, self.configs):
            role = self.exp.role(cfg.role)
            try:
                binding = self.resolver.resolve(cfg.role, role.model)
            except Exception as e:  # SessionFailed: no model, a bad backend option
                problems.append((f"role '{cfg.role}': {e}", t.span))
                continue
            if not isinstance(binding.backend, HFBackend):
                problems.append((f"role '{cfg.role}' is trained but its model runs on the {binding.backend.name} backend; "
                                 f"the local trainer trains hf models: run with --eval-only to play without training",
                                 t.span))
                continue
            b = binding.backend
            options = {"max_batch": b.max_batch, "device": b.device_option, "dtype": b.dtype_option,
                       "num_threads": b.num_threads, "cache_dir": b.cache_dir, "chat_template": b.chat_template,
                       "prefix_cache": b.prefix_cache}
            init = None
            if resume_from is not None:
                init = self.checkpoints.folder(cfg.role, self.start_step)
            try:
                policy = TrainedPolicy(cfg, binding.weights, {k: v for k, v in options.items() if v is not None},
                                       init_from=init)
                if init is not None:
                    policy.load_optimizer(init, moments=(init / "optimizer.safetensors").exists())
            except BackendError as e:  # more parameters than the memory available, a model that does not load
                problems.append((str(e), t.span))
                continue
            except Exception as e:
                if init is None:
                    raise
                # a file the header check passed but the load did not (a damaged tensor, a config transformers refuses)
                raise CheckpointDamaged(f"checkpoint step {self.start_step} cannot be resumed from: {init} does not "
                                        f"load ({e.__class__.__name__}: {e})") from None
            # the RL learning-rate schedule counts from the first RL update, after the sft stages' steps
            policy.lr_step0 = sum(1 for s in self.slots if s.phase.kind == "sft" and cfg.role in s.phase.roles)
            self.policies[cfg.role] = policy
        if problems:
            raise TrainingRefused(problems)

    @contextlib.contextmanager
    def serving(self, weights: str) -> Iterator[None]:
        """Within it, `resolve` serves the trained roles (and `current(role)` models) by
        `weights`: `trained` (the policies', as outside it) or `initial` (the spec's own
        models, as an evaluation run would: an evaluate stage's turn of the initial weights)."""
        before, self._serving = self._serving, weights
        try:
            yield
        finally:
            self._serving = before

    def resolve(self, role: str, name: str | None):
        """The engine's model resolver: trained roles and `current(role)` models get the
        trained weights; everything else resolves as in an evaluation run."""
        from askspec.runtime.engine.session import ModelBinding

        binding = self.resolver.resolve(role, name)
        if self._serving == "initial":
            return binding
        declared = self.exp.model(name or (self.exp.role(role).model or ""))
        owner = None
        if role in self.policies and (name is None or name == self.exp.role(role).model):
            owner = role
        elif declared is not None and declared.weights_of in self.policies:
            owner = declared.weights_of
        if owner is None:
            return binding
        return ModelBinding(name=binding.name, backend=self.policies[owner].backend, weights=binding.weights,
                            sampling=binding.sampling, max_tokens_cap=binding.max_tokens_cap)

    async def _refill(self, engine, log: StepLog, sl: schedule.Slot, plans: list[SessionPlan]) -> list[SessionPlan]:
        """Plays groups in place of the ones a route resampled until the step has `batch`
        sessions that were not, at most MAX_REFILL_ROUNDS rounds; returns their plans."""
        extra: list[SessionPlan] = []
        skip = 0

        def resampled(ps: list[SessionPlan]) -> int:
            return sum(1 for p in ps if p.group_id and any(
                log.routes.get((p.group_id, role)) == "resample" for role in {*(c.role for c in self.configs), "*"}))

        missing = resampled(plans)
        for round_ in range(1, MAX_REFILL_ROUNDS + 1):
            if missing <= 0:
                break
            more = self.planners[sl.phase.name].refill(sl.n, sl.step, round_, missing, skip)
            skip += len({p.group_id or p.session_id for p in more})
            await engine.run_phase(more)
            extra += more
            missing -= len(more) - resampled(more)
        return extra

    # -- resume ------------------------------------------------------------------------------

    @property
    def checkpoints(self) -> RunCheckpoints:
        """The run's checkpoint files (`run_dir` is set once the run directory exists)."""
        return RunCheckpoints(self.run_dir, tuple(c.role for c in self.configs))

    def latest_checkpoint(self) -> int:
        """The step `--resume` continues after (RunCheckpoints.latest)."""
        return self.checkpoints.latest()

    def resume_problem(self, step: int) -> str | None:
        """Why checkpoint `step` cannot be resumed from (RunCheckpoints.resume_problem)."""
        return self.checkpoints.resume_problem(step)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self, engine, log: StepLog, on_step=None) -> None:
        if self.start_step:
            book = self.checkpoints
            # a resumed schedule's buffers as they were at the checkpoint (items, ids, replay
            # statistics, the circular cursor)
            for name, state in (book.state(BUFFERS, self.start_step) or {}).items():
                if name in engine.buffers:
                    engine.buffers[name].restore(state)
            if self.inner is not None:
                self.inner.restore(book.root, self.start_step)
            stages = book.state(STAGES, self.start_step)
            if stages is not None:
                self.stage_state = StageState(**stages)
            self._emit_missing(log)
        if self.asynchronous:
            await self._run_async(engine, log, on_step)
            return
        for sl in self.slots[self.start_step:]:
            if sl.phase.stage in self.stage_state.stopped:  # its `keep` rule stopped the stage: no more steps
                continue
            if sl.phase.kind != "play":
                await self._run_stage_step(sl, engine, log, on_step)
                continue
            played = await self._play(sl, engine, log)
            metrics, keys = self._train(sl, played)
            if self._stage_end.get(sl.phase.stage) == sl.step:
                self._keep_best(sl, log)
            self._record(sl, played, keys, log)
            self._end_step(sl, metrics, engine, log, on_step)

    def _keep_best(self, sl: schedule.Slot, log: StepLog) -> None:
        """The train stage's last step, with `keep = best(accuracy)`: the inner role takes the
        kept promoted student's weights (none promoted: it keeps its own), before the step's
        checkpoint, so the later stages and a resumed run see them; a `keep` nested event
        records the choice."""
        stage = next((s for s in self.exp.stages if s.name == sl.phase.stage), None)
        if stage is None or (stage.options.get("keep") or {}).get("rule") != "best" or self.inner is None:
            return
        state = self.inner.kept_weights()
        best = self.inner.state.best
        if state is not None and best is not None:
            self.policies[self.inner.s.inner].take_weights(state)
        log.nested_event(step=sl.step, event="keep", dataset=best["dataset"] if best else None,
                         copy=best["copy"] if best else None, value=best["accuracy"] if best else None,
                         data={"rule": "best", "of": "accuracy", "kept": best,
                               "promotions": len(self.inner.state.promotions)})

    @property
    def asynchronous(self) -> bool:
        """Whether a step's update overlaps the next step's play (`max_staleness` > 0)."""
        return any(c.max_staleness > 0 for c in self.configs)

    async def _run_stage_step(self, sl: schedule.Slot, engine, log: StepLog, on_step) -> None:
        """A step of an sft, evaluate or retrain stage, recorded (and checkpointed)."""
        log.reset()
        engine.enter_step(sl.step, sl.phase.name)
        metrics = await self.stage_steps.step(sl, engine, log)
        self._end_step(sl, metrics, engine, log, on_step)

    async def _run_async(self, engine, log: StepLog, on_step) -> None:
        """Asynchronous rollouts (`max_staleness` ≥ 1; docs/training.md): the train stage's
        steps (all of them without stages) overlap in `_overlap`; a stage boundary drains
        the overlap, since `_overlap` plays nothing past its last step: no rollout is ever
        sampled for a step of another stage. An sft, evaluate or retrain stage's step then
        runs as without staleness, by the current weights (the served copy takes them
        before the step, and whatever the step trained after it), and the next train steps
        overlap afresh, their first on-policy."""
        slots = self.slots[self.start_step:]
        i = 0
        while i < len(slots):
            sl = slots[i]
            if sl.phase.kind != "play":
                if sl.phase.stage not in self.stage_state.stopped:  # its `keep` rule stopped the stage
                    self._publish()
                    await self._run_stage_step(sl, engine, log, on_step)
                    self._publish()
                i += 1
                continue
            j = i + 1
            while j < len(slots) and slots[j].phase.kind == "play" and slots[j].phase.stage == sl.phase.stage:
                j += 1
            await self._overlap(slots[i:j], engine, log, on_step)
            i = j

    def _publish(self) -> None:
        """The served copies take the trained weights (no session is playing)."""
        for policy in self.policies.values():
            policy.publish()

    async def _overlap(self, slots: list[schedule.Slot], engine, log: StepLog, on_step) -> None:
        """Consecutive play steps of one stage: step t's update runs in a worker thread while
        step t + 1 is played by the served copy of the weights, which holds the weights of
        before step t's update; once both are done, step t is recorded (and checkpointed)
        and the copy takes the updated weights. So step t + 1's rollouts are one update
        stale (the first step's, and a resumed run's first, none), within any bound K ≥ 1;
        the last step's update overlaps nothing."""
        played = await self._play(slots[0], engine, log)
        for i, sl in enumerate(slots):
            update = asyncio.ensure_future(asyncio.to_thread(self._train, sl, played))
            following = None
            try:
                if i + 1 < len(slots):
                    following = await self._play(slots[i + 1], engine, log)
            finally:  # never leave an update running on the weights
                metrics, keys = await update
            if self._stage_end.get(sl.phase.stage) == sl.step:
                self._keep_best(sl, log)
            self._record(sl, played, keys, log)
            self._end_step(sl, metrics, engine, log, on_step)
            self._publish()
            if following is None:
                break
            played = following

    async def _play(self, sl: schedule.Slot, engine, log: StepLog) -> Played:
        """Play step `sl`'s sessions (and its refills and inner loop) by the served weights;
        each rollout records the policy version that sampled it."""
        t0 = time.perf_counter()
        log.reset()
        engine.enter_step(sl.step, sl.phase.name)
        plans, replay_ids = self.plans(sl, engine)
        # the served weights change only between plays (policy.publish), so one version per role;
        # on-policy they are the trained weights themselves
        versions = {r: p.sampling_version if self.asynchronous else p.version for r, p in self.policies.items()}
        if plans:
            await engine.run_phase(plans, replay_ids)
            if sl.phase.plain:
                plans += await self._refill(engine, log, sl, plans)
        sessions = [log.sessions[p.session_id] for p in plans if p.session_id in log.sessions]
        nested = None
        if self.inner is not None:  # the outer step's inner loop writes the outer rewards
            # its sessions take the end of the step's index range (the outer games' come first)
            nested = await self.inner.run(sl.step, self.index0[sl.step] - self.inner.max_sessions(), engine, log,
                                          sessions)
        for s in sessions:
            for r in s.rollouts:
                r.setdefault("policy_version", versions.get(r["role"]))
        return Played(plans, sessions, log.routes, nested, versions, t0, time.perf_counter() - t0)

    def _train(self, sl: schedule.Slot, played: Played) -> tuple[Metrics, TurnKeys]:
        """Update every role of step `sl` on its played sessions (update.update_roles)."""
        return update_roles(sl, played, self.by_role, self.policies,
                            lambda role: gate_reason(self.exp, self.gates.get(role), played.plans, played.sessions))

    def _record(self, sl: schedule.Slot, played: Played, keys: TurnKeys, log: StepLog) -> None:
        """Step `sl`'s rollout shard: every turn of a trained role, token by token."""
        from askspec.runtime.store import rollouts

        rows = rollout_rows(log.run_id, log.generation, sl.step, played, keys)
        rollouts.write_shard(self.run_dir, sl.step, log.generation, rows)

    def _end_step(self, sl: schedule.Slot, metrics: dict[str, dict[str, Any]], engine, log: StepLog, on_step) -> None:
        """Checkpoint (when due) and record the step's train_steps."""
        step = sl.step
        log.flush()  # the step's sessions and buffer events are on disk before a checkpoint names it
        bad = [role for role, m in metrics.items() if m.get("nonfinite")]
        for role in bad:
            self.nonfinite.setdefault(role, []).append(step)
        # a step not applied writes no checkpoint: the newest one stays the newest finite update; a step
        # a stage's `keep` rule stopped at is its stage's last (the weights the later stages use)
        stopped = sl.phase.stage is not None and (self.stage_state.stopped.get(sl.phase.stage) == step
                                                  or self.stage_state.selected.get(sl.phase.stage, {}).get("at") == step)
        if not bad and (step % min(c.save_every for c in self.configs) == 0 or step == self.steps or stopped):
            self.checkpoint(step, metrics, engine)
        mismatched = mismatched_roles(metrics, lambda role: self.policies[role].mismatch_bound)
        for role, m in metrics.items():
            log.train_step(role, step, jsonable(m))
        log.flush()
        if on_step is not None:
            on_step(step, metrics)
        stop = [role for role in mismatched if self.by_role[role].on_mismatch == "error"]
        if stop:
            raise TrainingStopped("; ".join(f"role '{role}': {metrics[role]['mismatch_warning']}" for role in stop)
                                  + " (on_mismatch = error). The sampler did not play the weights being trained: "
                                    "run with `prefix_cache = false` on the role's model to narrow it down, and "
                                    "report it; or set on_mismatch = warn")
        for role in bad:
            steps, limit = self.nonfinite[role], self.by_role[role].max_nonfinite_steps
            if len(steps) >= limit:
                raise TrainingStopped(
                    f"role '{role}': {len(steps)} training step(s) had a NaN or infinite {metrics[role]['nonfinite']} "
                    f"(steps {', '.join(map(str, steps))}; max_nonfinite_steps = {limit}); their updates were not "
                    f"applied and no checkpoint holds them ({self.checkpoints.newest_words()}). Check the rewards "
                    f"(train_steps: skipped, metrics->>'skip_reason'), lower `lr`, or raise `max_nonfinite_steps`")

    def plans(self, sl: schedule.Slot, engine) -> tuple[list[SessionPlan], dict[str, list[int]]]:
        """Step `sl`'s sessions: its plain games' next elements, then a batch of each
        replayed buffer's items in circular order (the buffer's cursor advances)."""
        index0 = self.index0[sl.step - 1]
        plans = self.planners[sl.phase.name].plans(sl.n, index0, sl.step) if sl.phase.plain else []
        if sl.phase.stage is not None:
            plans = [dataclasses.replace(p, stage=sl.phase.stage) for p in plans]
        replay_ids: dict[str, list[int]] = {}
        for name in sl.phase.replay:
            game = self.game_named(name)
            count, size = sl.phase.replay_items[name], sl.phase.groups[name]
            batch = engine.buffers[replays_buffer(game)].next_batch(count)
            replay_ids[name] = [item_id for item_id, _ in batch]
            for j, (item_id, item) in enumerate(batch):
                plans += [dataclasses.replace(p, stage=sl.phase.stage) for p in Draw("replay", sl.step, j).sessions(
                    self.seed, name, item_id, bind(game, item), size, index0 + len(plans), item_index=j)]
        return plans, replay_ids

    def checkpoint(self, step: int, metrics: dict[str, dict[str, Any]], engine=None) -> None:
        """Every role's checkpoint of `step` and the state the step carries (buffers, the
        inner loop, the stages), committed by latest.json (RunCheckpoints: the order)."""
        book = self.checkpoints
        for role, policy in self.policies.items():
            if not policy.finite():  # a finite gradient can still overflow a weight (a huge lr)
                raise TrainingStopped(f"role '{role}': after step {step} some weights are NaN or infinite, so no "
                                      f"checkpoint is written ({book.newest_words()}); lower `lr` or `grad_clip`")
        for role, policy in self.policies.items():
            policy.save(book.folder(role, step), step, jsonable(metrics.get(role, {})))
        if engine is not None and engine.buffers:
            book.write_state(BUFFERS, step, {name: b.state() for name, b in engine.buffers.items()})
        if self.inner is not None:
            self.inner.save(book.root, step)
        if self.exp.stages:
            book.write_state(STAGES, step, dataclasses.asdict(self.stage_state))
        book.commit(step, keep=min(c.keep_checkpoints for c in self.configs))

    def _emit_missing(self, log: StepLog) -> None:
        """A kill between a checkpoint and its train_steps event: write the event from the
        checkpoint's own record of the step's metrics."""
        from askspec.runtime.store.views import open_store

        log.flush()
        try:
            con = open_store(self.run_dir)
            have = {(r, int(s)) for r, s in con.execute("SELECT role, step FROM train_steps").fetchall()}
        except Exception:
            have = set()
        done = self.slots[self.start_step - 1]
        for role in done.phase.roles:
            if (role, self.start_step) in have or (done.phase.kind == "play" and done.n > self.by_role[role].steps):
                continue
            state = self.checkpoints.folder(role, self.start_step) / "trainer_state.json"
            metrics = json.loads(state.read_text(encoding="utf-8")).get("metrics") or {}
            log.train_step(role, self.start_step, metrics)
        log.flush()
