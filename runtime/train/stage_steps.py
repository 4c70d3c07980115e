"""The steps of the non-RL stages as the local trainer plays them (the stages' rules are
in stages.py): an sft stage's update on a batch of records, an evaluate stage's games
played against each weights (a post-hoc plateau's kept checkpoints in turn), and a retrain
stage's fresh role playing its game over the step's items and updated on them, with its
`keep` rule (stop at a plateau, or keep checkpoints and select one after the last step).
`StageSteps` holds the trainer it plays for (what it reads of it: `StagesHost`), as the nested
schedule's InnerLoop does; `StageState` is what the stages carry past a step (checkpointed)."""

from __future__ import annotations

import dataclasses
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

from askspec.ir import model as ir

from askspec.runtime.engine.plan import SessionPlan, derive_seed
from askspec.runtime.train import schedule
from askspec.runtime.train.batch import build_batch
from askspec.runtime.train.checkpoints import STAGES, RunCheckpoints
from askspec.runtime.train.config import TrainConfig
from askspec.runtime.train.nested import InnerLoop
from askspec.runtime.train.planner import Element, StepPlanner
from askspec.runtime.train.steplog import StepLog, jsonable


@dataclass
class StageState:
    """What the stages carry from one step to the next (checkpointed with it)."""

    sampled: dict[str, list] = dataclasses.field(default_factory=dict)  # retrain stage -> its sampled items
    rewards: dict[str, list] = dataclasses.field(default_factory=dict)  # retrain stage -> mean reward per step
    stopped: dict[str, int] = dataclasses.field(default_factory=dict)  # stage -> the step `keep` stopped it at
    # a post-hoc plateau's stage -> its kept checkpoints (stage steps; checkpoints/stages/<stage>/step-<n>)
    kept: dict[str, list] = dataclasses.field(default_factory=dict)
    selected: dict[str, dict] = dataclasses.field(default_factory=dict)  # stage -> its post-hoc selection


class StagesHost(Protocol):
    """What a trainer gives its stage steps (LocalTrainer is one)."""

    exp: ir.Experiment
    seed: int
    configs: list[TrainConfig]
    by_role: dict[str, TrainConfig]
    policies: dict[str, Any]
    datasets: dict[str, list]
    evaluated: dict[str, list[Element]]  # an evaluate stage's elements
    sampling: dict[str, list[Element]]  # a retrain stage's sample game's elements
    stage_state: StageState
    index0: list[int]  # per step: its first session index
    inner: InnerLoop | None

    @property
    def checkpoints(self) -> RunCheckpoints: ...

    def game_named(self, name: str) -> ir.Game: ...

    def planner_over(self, games: list[ir.Game], collections: dict[str, list], seed: int, groups: Mapping[str, int],
                     batch: int) -> StepPlanner: ...

    def serving(self, weights: str) -> AbstractContextManager[None]: ...


class StageSteps:
    """The sft, evaluate and retrain stages' steps of one trainer's schedule."""

    def __init__(self, trainer: StagesHost) -> None:
        self.t = trainer

    def take(self, role: str, path: Path) -> None:
        """The role's weights (trained and served) become a kept checkpoint's."""
        from askspec.runtime.train.nested import _load_weights

        policy = self.t.policies[role]
        policy.take_weights(_load_weights(path))
        policy.publish()

    def sample_sessions(self, stage: ir.Stage) -> int:
        """Sessions of a retrain stage's `sample` game (played at the stage's first step)."""
        return sum(e.size for e in self.t.sampling.get(stage.name, []))

    def stage(self, sl: schedule.Slot) -> ir.Stage:
        return next(s for s in self.t.exp.stages if s.name == sl.phase.stage)

    async def step(self, sl: schedule.Slot, engine, log: StepLog) -> dict[str, dict[str, Any]]:
        """A step of an sft stage (its role trained on a batch of the data set) or of an
        evaluate stage (its games played against each weights); see stages.py."""
        from askspec.runtime.train import stages

        t0 = time.perf_counter()
        stage = self.stage(sl)
        if stage.kind == "evaluate":
            index0 = self.t.index0[sl.step - 1]
            averaged = self._averaged(stage) if "trained" in stage.options["weights"] else {}
            for weights in stage.options["weights"]:
                rounds = max((len(paths) for paths in averaged.values()), default=1) if weights == "trained" else 1
                for k in range(rounds):
                    tag = ""
                    if weights == "trained" and averaged:  # a post-hoc plateau's window: each checkpoint in turn
                        tag = f"-c{k}"
                        for role, paths in averaged.items():
                            self.take(role, paths[min(k, len(paths) - 1)])
                    plans = stages.eval_plans(stage, self.t.evaluated[sl.phase.name], self.t.seed, sl.step, index0,
                                              weights=[weights], tag=tag)[weights]
                    index0 += len(plans)
                    with self.t.serving(weights):
                        await engine.run_phase(plans, {})
            for role, paths in averaged.items():  # the later stages get the selected checkpoint
                self.take(role, paths[0])
            return {}
        if stage.kind == "retrain":
            return await self._retrain_step(sl, stage, engine, log)
        role = sl.phase.roles[0]
        policy, opts = self.t.policies[role], stage.options
        batch = stages.sft_batch(self.t.datasets.get(opts["data"]) or [], opts, sl.n)
        context = getattr(policy.model.config, "max_position_embeddings", None)
        trajectories = stages.sft_trajectories(policy.tokenizer, policy.backend.chat_template, policy.pad_id, batch,
                                               opts, sl.step, context)
        rl_cfg, policy.cfg = policy.cfg, stages.sft_config(policy.cfg, opts)
        version = policy.version
        try:
            m = policy.update(trajectories)
        finally:
            policy.cfg = rl_cfg
        if sl.n == opts["steps"]:
            policy.optimizer.state.clear()  # the RL stage starts with fresh AdamW moments, as a separate run would
        m.update(step=sl.step, iteration=1, phase=sl.phase.name, stage=stage.name, algorithm="sft", sessions=0,
                 records=len(batch), seconds=time.perf_counter() - t0, policy_version=version, excluded={})
        return {role: m}

    async def _retrain_step(self, sl: schedule.Slot, stage: ir.Stage, engine, log: StepLog) -> dict[str, dict[str, Any]]:
        """A step of a retrain stage (stages.py): the fresh role plays the stage's game over
        the step's items and is updated on those sessions."""
        from askspec.runtime.train import stages
        from askspec.runtime.train.nested import data_name

        t0 = time.perf_counter()
        opts, role = stage.options, stage.options["role"]
        policy = self.t.policies[role]
        index0 = self.t.index0[sl.step - 1]
        sampled: dict[str, Any] = {}
        if sl.n == 1 and stage.name in self.t.sampling:  # by the weights the stages before left, the role's included
            sample = stages.sample_plans(stage, self.t.sampling[stage.name], self.t.seed, sl.step, index0)
            await engine.run_phase(sample, {})
            index0 += len(sample)
            played = [log.sessions[p.session_id] for p in sample if p.session_id in log.sessions]
            items = stages.sampled_items(self.t.game_named(opts["sample"]), played, log.parsed)
            self.t.stage_state.sampled[stage.name] = [jsonable(it) for it in items]
            sampled = {"sampled": len(items), "sample_sessions": len(sample)}
        if sl.n == 1:  # a fresh copy: the spec's weights and a new AdamW (a resumed step n > 1 has its checkpoint's)
            policy.reset()
        policy.lr_step0 = policy.version - (sl.n - 1)  # the stage's own learning-rate schedule
        promotions = self.t.inner.state.promotions if self.t.inner is not None else []
        items, n = stages.retrain_items(opts, promotions, self.t.datasets, sl.n, self.t.stage_state.sampled.get(stage.name))
        m: dict[str, Any]
        plans: list[SessionPlan] = []
        version = policy.version
        if not items:
            m = {"skipped": "no_data", "skip_reason": "nothing to train on (no promoted dataset and no data)",
                 "trajectories": 0, "tokens": 0}
        else:
            game = self.t.game_named(opts["game"])
            planner = self.t.planner_over([game], {**self.t.datasets, data_name(game) or "": items},
                                          derive_seed(self.t.seed, "retrain", stage.name), sl.phase.groups, sl.phase.batch)
            plans = [dataclasses.replace(p, stage=stage.name) for p in planner.plans(n, index0, sl.step)]
            await engine.run_phase(plans, {})
            sessions = [log.sessions[p.session_id] for p in plans if p.session_id in log.sessions]
            b = build_batch(role, sessions, log.routes)
            rl_cfg, policy.cfg = policy.cfg, stages.retrain_config(policy.cfg, opts)
            try:
                m = policy.update(b.trajectories)
            finally:
                policy.cfg = rl_cfg
            m["excluded"] = b.excluded
        m.update(step=sl.step, iteration=1, phase=sl.phase.name, stage=stage.name, algorithm=self.t.by_role[role].algorithm,
                 sessions=len(plans), items=len(items), seconds=time.perf_counter() - t0, policy_version=version,
                 **sampled)
        keep = opts.get("keep")
        if keep is not None and keep["rule"] == "plateau":
            rewards = self.t.stage_state.rewards.setdefault(stage.name, [])
            rewards.append(m.get("reward_mean"))
            if keep.get("select") == "posthoc":
                self._posthoc_step(sl, stage, m)
                return {role: m}
            hit = stages.plateau(rewards, int(keep["window"]), float(keep["fraction"]), int(keep.get("min_steps") or 0))
            if hit is not None:  # this step's weights are the stage's: its later steps are not played
                self.t.stage_state.stopped[stage.name] = sl.step
                m.update(stopped=True, plateau=hit, stopped_after=sl.n)
        return {role: m}

    def _kept_path(self, stage: str, n: int) -> Path:
        return self.t.checkpoints.root / STAGES / stage / f"step-{n}.safetensors"

    def _posthoc_step(self, sl: schedule.Slot, stage: ir.Stage, m: dict[str, Any]) -> None:
        """A step of a retrain stage with `keep = plateau(..., select = posthoc)`: the role's
        weights are kept every `every` steps and at the last; after the last, the plateau is
        selected over the whole curve (stages.plateau_posthoc), the role takes the first
        checkpoint of the averaging window (the later stages' weights) and only the window's
        checkpoints stay on disk, for the evaluate stages after it (`_averaged`)."""
        from askspec.runtime.train import stages
        from askspec.runtime.train.nested import _save_weights

        keep, n, total = stage.options["keep"], sl.n, int(stage.options["steps"])
        policy = self.t.policies[stage.options["role"]]
        kept = self.t.stage_state.kept.setdefault(stage.name, [])
        if n % int(keep["every"]) == 0 or n == total:
            path = self._kept_path(stage.name, n)
            path.parent.mkdir(parents=True, exist_ok=True)
            _save_weights(policy.state(), path)
            kept.append(n)
        if n < total:
            return
        hit = stages.plateau_posthoc(self.t.stage_state.rewards[stage.name], int(keep["window"]), float(keep["fraction"]))
        window = stages.averaged_checkpoints(kept, int(hit["step"]), int(keep["average"]), total)
        if window[0] != n:
            self.take(stage.options["role"], self._kept_path(stage.name, window[0]))
        for old in kept:
            if old not in window:
                self._kept_path(stage.name, old).unlink(missing_ok=True)
        self.t.stage_state.kept[stage.name] = window
        self.t.stage_state.selected[stage.name] = {**hit, "checkpoints": window, "at": sl.step}
        m.update(plateau=hit, selected_step=hit["step"], checkpoints=window)

    def _averaged(self, stage: ir.Stage) -> dict[str, list[Path]]:
        """Per role, the checkpoints an evaluate stage's `trained` weights average over: the
        window of a post-hoc plateau's retrain stage that last trained the role before it
        (an sft, retrain or the train stage after it trains the role anew: none)."""
        last: dict[str, str] = {}
        for st in self.t.exp.stages:
            if st.name == stage.name:
                break
            if st.kind in ("sft", "retrain"):
                last[st.options["role"]] = st.name
            elif st.kind == "train":
                last.update({c.role: st.name for c in self.t.configs})
        return {role: [self._kept_path(name, n) for n in self.t.stage_state.kept.get(name, [])]
                for role, name in last.items() if name in self.t.stage_state.selected}
