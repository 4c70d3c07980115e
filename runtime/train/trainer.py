"""The training loop behind `askspec run` on a spec with `train` blocks (schedule `online`,
the default: every trained role is updated from every game, every step).

A step plays `batch` sessions (whole groups: a `sample N` game's N, else the train block's
`group` repeats of one game element), walking the games' elements in plan order and
cycling; records each trained role's turns token by token (Parquet rollout shards);
turns the sessions into trajectories, rewards and groups (batch.py); updates every trained
role (policy.py) and writes one `train_steps` event per role. The trained roles' turns
are served by hf backends running the very weights being trained, so the next step
samples from the updated policy; `current(role)` models share them.

Resume. Checkpoints are written every `save_every` steps and after the last; a resumed run
(`--resume` after any crash or `kill -9`) reloads the newest complete one (weights and
optimizer) and plays again every step after it, with the same sessions and seeds. The
sessions of a replayed step are new attempts and its `train_steps` events supersede the
earlier ones, so each view shows every step exactly once.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from askspec.ir import model as ir

from askspec.runtime.engine.plan import SessionPlan, derive_seed, replays_buffer
from askspec.runtime.train.batch import SessionRecord, build_batch
from askspec.runtime.train.config import config_from_ir

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"


class TrainingRefused(Exception):
    """The spec or the options ask for training the local trainer cannot do: one message
    per problem, each with the IR span it is about (None for a command-line option)."""

    def __init__(self, problems: list[tuple[str, ir.Span | None]]) -> None:
        super().__init__("; ".join(m for m, _ in problems))
        self.problems = problems


# ---------------------------------------------------------------------------------------
# which sessions a step plays


@dataclass(frozen=True)
class _Element:
    game: ir.Game
    item_index: int
    bindings: dict[str, Any]
    size: int  # sessions of this element in one step (its group)


class StepPlanner:
    """Sessions of each training step: elements in plan order, cycling, whole groups."""

    def __init__(self, exp: ir.Experiment, games: list[ir.Game], params: dict[str, Any], collections: dict[str, list],
                 seed: int, group: int | None, batch: int | None) -> None:
        from askspec.runtime.engine.evaluator import Env, evaluate

        self.seed = seed
        self.elements: list[_Element] = []
        for game in games:
            items = [None]
            if game.iter is not None:
                items = evaluate(game.iter, Env(vars={}, params=params, collections=collections))
                if not isinstance(items, list):
                    raise ValueError(f"game {game.name}: 'for' did not produce a list")
            size = game.group_size if game.group_size > 1 else (group or 1)
            for k, item in enumerate(items):
                if game.pattern and len(game.pattern) == 1:
                    bindings = {game.pattern[0]: item}
                elif game.pattern:
                    bindings = dict(zip(game.pattern, list(item)))
                else:
                    bindings = {}
                self.elements.append(_Element(game, k, bindings, size))
        if not self.elements:
            raise ValueError("the trained games plan no sessions (an empty data set?)")
        self.batch = batch or self.elements[0].size
        self._starts: list[tuple[int, int]] = [(0, 0)]  # per step: (first element position, first index)

    def _bounds(self, step: int) -> tuple[int, int, int]:
        """(first element position, element count, first session index) of 1-based `step`."""
        while len(self._starts) < step:
            pos, index = self._starts[-1]
            count, sessions = self._take(pos)
            self._starts.append((pos + count, index + sessions))
        pos, index = self._starts[step - 1]
        count, _ = self._take(pos)
        return pos, count, index

    def _take(self, pos: int) -> tuple[int, int]:
        count = sessions = 0
        while sessions < self.batch:
            sessions += self.elements[(pos + count) % len(self.elements)].size
            count += 1
        return count, sessions

    def sessions_per_step(self, step: int) -> int:
        pos, count, _ = self._bounds(step)
        return sum(self.elements[(pos + i) % len(self.elements)].size for i in range(count))

    def plans(self, step: int) -> list[SessionPlan]:
        pos, count, index = self._bounds(step)
        out: list[SessionPlan] = []
        for j in range(count):
            e = self.elements[(pos + j) % len(self.elements)]
            epoch = (pos + j) // len(self.elements)
            group_id = f"{e.game.name}-t{step:06d}-e{j:03d}" if e.size > 1 else None
            for member in range(e.size):
                k = index + len(out)
                out.append(SessionPlan(index=k, session_id=f"s{k:06d}", game=e.game.name, group_id=group_id,
                                       group_size=e.size, bindings={**e.bindings, "__step__": step},
                                       seed=derive_seed(self.seed, e.game.name, e.item_index, "train", epoch, member)))
        return out


# ---------------------------------------------------------------------------------------
# what a step recorded


class StepLog:
    """The run writer, passed through, keeping what the trainer needs from the current
    step: each session's status, variables, rewards and rollouts, and the groups' routes."""

    def __init__(self, writer) -> None:
        self._writer = writer
        self.sessions: dict[str, SessionRecord] = {}
        self.routes: dict[tuple[str, str], str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)

    def reset(self) -> None:
        self.sessions, self.routes = {}, {}

    def session_started(self, session_id: str, *, game: str, group_id: str | None, params: dict, index: int) -> int:
        attempt = self._writer.session_started(session_id, game=game, group_id=group_id, params=params, index=index)
        self.sessions[session_id] = SessionRecord(session_id, group_id, attempt)
        return attempt

    def reward(self, session_id: str, attempt: int, *, role: str, turn_index: int | None, name: str, value: float,
               kind: str) -> None:
        self._writer.reward(session_id, attempt, role=role, turn_index=turn_index, name=name, value=value, kind=kind)
        if session_id in self.sessions:
            self.sessions[session_id].rewards.append((role, turn_index, name, float(value)))

    def session_finished(self, session_id: str, attempt: int, *, status: str, outcome: str | None, error: str | None,
                         vars: dict, bookkeeping: dict | None = None) -> None:
        self._writer.session_finished(session_id, attempt, status=status, outcome=outcome, error=error, vars=vars,
                                      bookkeeping=bookkeeping)
        rec = self.sessions.get(session_id)
        if rec is not None:
            rec.status, rec.vars, rec.book = status, vars, bookkeeping or {}

    def group(self, group_id: str, *, route: str, stats: dict, members: list[str], **counts: Any) -> None:
        self._writer.group(group_id, route=route, stats=stats, members=members, **counts)
        self.routes[(group_id, stats.get("role") or "*")] = route

    def rollout(self, plan: SessionPlan, attempt: int, turn_index: int, role: str, result, temperature: float,
                sample_key: str | None) -> None:
        rec = self.sessions.get(plan.session_id)
        if rec is None:
            return
        rec.rollouts.append({"role": role, "turn_index": turn_index, "sample_key": sample_key,
                             "prompt_ids": result.prompt_ids, "completion_ids": result.completion_ids,
                             "logprobs": result.logprobs, "temperature": float(temperature),
                             "finish_reason": result.finish_reason})


# ---------------------------------------------------------------------------------------
# the trainer


class LocalTrainer:
    """Trains every role of the spec's `train` blocks on the hf backend (see module doc)."""

    def __init__(self, exp: ir.Experiment, *, params: dict[str, Any], datasets: dict[str, list], seed: int,
                 resolver, run_dir: str | os.PathLike[str] | None) -> None:
        self.exp = exp
        self.seed = seed
        self.resolver = resolver  # commands.run.ModelResolver
        self.run_dir = Path(run_dir or ".")  # set by the run command once the run directory exists
        self.configs = [config_from_ir(t, exp) for t in exp.training]
        self.check(exp)
        self.games = self._games(exp)
        first = self.configs[0]
        self.planner = StepPlanner(exp, self.games, params, dict(datasets), seed, first.group, first.batch)
        self.steps = first.steps
        self.policies: dict[str, Any] = {}
        self.start_step = 0

    # -- what cannot run -------------------------------------------------------------------

    def check(self, exp: ir.Experiment) -> None:
        problems: list[tuple[str, ir.Span | None]] = []
        if exp.schedule is not None and exp.schedule.kind != "online":
            problems.append((f"the '{exp.schedule.kind}' schedule is not carried out by the local trainer yet (it runs "
                             f"'online': every trained role updated from every game); run with --eval-only to play "
                             f"the games without training", exp.schedule.span))
        roles = [c.role for c in self.configs]
        for t, cfg in zip(exp.training, self.configs):
            if roles.count(cfg.role) > 1:
                problems.append((f"role '{cfg.role}' has more than one train block", t.span))
            if cfg.replay is not None:
                problems.append((f"'replay = {cfg.replay}' (training on a buffer's items) is not carried out by the local "
                                 f"trainer yet; remove it or run with --eval-only", t.span))
        trained = {r.name for r in exp.roles if r.trained}
        untrained = sorted(trained - set(roles))
        for name in untrained:
            problems.append((f"role '{name}' is marked 'trained' but has no train block: add `train {name} with ...`, "
                             f"or run with --eval-only", exp.role(name).span))
        if problems:
            raise TrainingRefused(problems)

    def _games(self, exp: ir.Experiment) -> list[ir.Game]:
        games = [g for g in exp.games if replays_buffer(g) is None]
        if exp.schedule is not None and isinstance(exp.schedule.options.get("games"), list):
            chosen = set(exp.schedule.options["games"])
            games = [g for g in games if g.name in chosen]
        return games

    def engine_experiment(self) -> ir.Experiment:
        """The experiment the engine runs each step: the trained games only (a game that
        replays a buffer belongs to a schedule this trainer does not run)."""
        return self.exp.model_copy(update={"games": self.games})

    def planned_sessions(self) -> int:
        return self.planner_sessions_before(self.steps)

    def planner_sessions_before(self, step: int) -> int:
        """Sessions of steps 1..step."""
        return sum(self.planner.sessions_per_step(k) for k in range(1, step + 1))

    # -- models ----------------------------------------------------------------------------

    def load_policies(self, resume_from: Path | None) -> None:
        """One TrainedPolicy per trained role, from the spec's weights or a checkpoint."""
        from askspec.runtime.backends.hf import HFBackend
        from askspec.runtime.train.policy import TrainedPolicy

        problems = []
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
                       "num_threads": b.num_threads, "cache_dir": b.cache_dir, "chat_template": b.chat_template}
            init = None
            if resume_from is not None:
                init = self.run_dir / CHECKPOINTS / cfg.role / f"step-{self.start_step}"
            policy = TrainedPolicy(cfg, binding.weights, {k: v for k, v in options.items() if v is not None}, init_from=init)
            if init is not None:
                policy.load_optimizer(init)
            self.policies[cfg.role] = policy
        if problems:
            raise TrainingRefused(problems)

    def resolve(self, role: str, name: str | None):
        """The engine's model resolver: trained roles and `current(role)` models get the
        trained weights; everything else resolves as in an evaluation run."""
        from askspec.runtime.engine.session import ModelBinding

        binding = self.resolver.resolve(role, name)
        declared = self.exp.model(name or (self.exp.role(role).model or ""))
        owner = None
        if role in self.policies and (name is None or name == self.exp.role(role).model):
            owner = role
        elif declared is not None and declared.weights_of in self.policies:
            owner = declared.weights_of
        if owner is None:
            return binding
        return ModelBinding(name=binding.name, backend=self.policies[owner].backend, weights=binding.weights,
                            sampling=binding.sampling)

    # -- resume ------------------------------------------------------------------------------

    def latest_checkpoint(self) -> int:
        path = self.run_dir / CHECKPOINTS / LATEST
        if not path.exists():
            return 0
        return int(json.loads(path.read_text(encoding="utf-8"))["step"])

    # -- the loop ----------------------------------------------------------------------------

    async def run(self, engine, log: StepLog, on_step=None) -> None:
        from askspec.runtime.store import rollouts

        if self.start_step:
            self._emit_missing(log)
        for step in range(self.start_step + 1, self.steps + 1):
            t0 = time.perf_counter()
            log.reset()
            plans = self.planner.plans(step)
            await engine.run(plans)
            played = time.perf_counter() - t0
            sessions = [log.sessions[p.session_id] for p in plans if p.session_id in log.sessions]
            metrics: dict[str, dict[str, Any]] = {}
            keys: dict[tuple[str, int], tuple[str, str]] = {}
            for cfg in self.configs:
                policy = self.policies[cfg.role]
                batch = build_batch(cfg.role, sessions, log.routes, need_reward=cfg.loss != "sft")
                for tr in batch.trajectories:
                    for turn in tr.turns:
                        keys[(turn.session_id, turn.turn_index)] = (tr.key, tr.group_key)
                version = policy.version
                m = policy.update(batch.trajectories)
                m.update(step=step, algorithm=cfg.algorithm, sessions=len(plans), seconds_play=played,
                         seconds=time.perf_counter() - t0, policy_version=version, excluded=batch.excluded)
                metrics[cfg.role] = m
            rows = []
            for s in sessions:
                for r in s.rollouts:
                    traj, group = keys.get((s.session_id, r["turn_index"]), (None, None))
                    rows.append({"run_id": log.run_id, "session_id": s.session_id, "attempt": s.attempt,
                                 "turn_index": r["turn_index"], "role": r["role"], "step": step, "trajectory": traj,
                                 "group_key": group, "policy_version": self.policies[r["role"]].version - 1,
                                 "temperature": r["temperature"], "finish_reason": r["finish_reason"],
                                 "prompt_ids": list(r["prompt_ids"]), "completion_ids": list(r["completion_ids"]),
                                 "logprobs": list(r["logprobs"]), "gen": log.generation})
            rollouts.write_shard(self.run_dir, step, log.generation, rows)
            if step % min(c.save_every for c in self.configs) == 0 or step == self.steps:
                self.checkpoint(step, metrics)
            for role, m in metrics.items():
                log.train_step(role, step, _jsonable(m))
            log.flush()
            if on_step is not None:
                on_step(step, metrics)

    def checkpoint(self, step: int, metrics: dict[str, dict[str, Any]]) -> None:
        """Every role's checkpoint of `step`, then `latest.json` naming it (the commit point)."""
        from askspec.runtime.store.layout import write_json_atomic

        root = self.run_dir / CHECKPOINTS
        for role, policy in self.policies.items():
            policy.save(root / role / f"step-{step}", step, _jsonable(metrics.get(role, {})))
        write_json_atomic(root / LATEST, {"step": step, "roles": {r: f"{r}/step-{step}" for r in self.policies}})
        keep = min(c.keep_checkpoints for c in self.configs)
        for role in self.policies:
            done = sorted((p for p in (root / role).glob("step-*") if p.name[5:].isdigit()), key=lambda p: int(p.name[5:]))
            for old in done[:-1]:  # only the newest keeps the optimizer state (resume needs no other)
                (old / "optimizer.safetensors").unlink(missing_ok=True)
            for old in done[:-keep]:
                shutil.rmtree(old, ignore_errors=True)

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
        for role in self.policies:
            if (role, self.start_step) in have:
                continue
            state = self.run_dir / CHECKPOINTS / role / f"step-{self.start_step}" / "trainer_state.json"
            metrics = json.loads(state.read_text(encoding="utf-8")).get("metrics") or {}
            log.train_step(role, self.start_step, metrics)
        log.flush()


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
