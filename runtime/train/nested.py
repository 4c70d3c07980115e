"""The `nested` schedule's inner loop (SOAR, docs/training.md "Schedules"): what one outer
step does between playing the outer games and updating the outer role.

1. **Datasets.** Each `sample N ask OUTER` of an outer session is one dataset X_k; its
   items are the replies' fields (a reply without a `question` field gives its text as
   `question`). Replies the game dropped (malformed after the retries) are not items.
2. **Baseline.** The `evaluate` game is played once per item of a fresh sample of
   `reward_questions` items of its data set, with the inner role's current weights; the
   accuracy is the mean of its sessions' `score` variable (a failed session scores 0).
3. **Copies.** For each dataset, `copies` copies of the inner role (policy.fork) are each
   trained `inner_steps` steps (+ `extra_inner_steps` once a promotion happened, the
   paper's longer inner loop for an improved baseline) by playing the `practice` game
   over the dataset's items (the train block's `group` and `batch`), then evaluated on the
   same reward questions. One copy lives at a time; its weights wait on disk
   (`checkpoints/nested/work/`) only while it may still be the one promoted. A copy's
   seeds and session numbers follow (step, k, j) alone (`train_copy`), so the cluster's
   inner-loop service trains the copies on a pool of workers with the same result.
4. **Outer reward.** R_k = mean_j acc(copy k,j) − acc(baseline), written as a turn reward
   `grounded` on every outer reply of X_k; the outer role's group is all datasets of the
   session (so RLOO compares datasets). With `outer_reward = intrinsic` steps 2-4 are
   skipped and the outer role trains on the game's own rewards (SOAR's Intrinsic-T).
5. **Promotion.** The mean outer reward of the step joins a moving average over the last
   `promotion_window` steps, one running average over the whole run, not reset by a
   promotion (SOAR's Alg. 1 updates one R̄_t every step; Fig. 16: the rewards drop after a
   promotion and the average follows them); above `promotion_threshold`, the median copy (the lower
   median by reward) of the best dataset becomes the inner role's weights and the dataset
   joins the promoted ones. With `stage NAME train { keep = best(accuracy) }` each promoted
   student that is more accurate on its step's reward questions than every one before is
   kept (`checkpoints/nested/best-step-<n>.safetensors`, `LoopState.best`); the trainer
   gives the inner role its weights when the train stage ends (SOAR's PS).

Everything is recorded as `nested_events` (event: baseline, inner_step, copy, dataset,
decision, promotion). The loop's state (averaged rewards, promotions, promoted datasets)
is checkpointed with the outer step (`checkpoints/nested/step-<n>.json`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

from askspec.ir import model as ir

from askspec.runtime.engine.plan import SessionPlan, derive_seed
from askspec.runtime.train.checkpoints import CHECKPOINTS, NESTED
from askspec.runtime.train.steplog import jsonable


@dataclass(frozen=True)
class Settings:
    outer: str
    inner: str
    copies: int
    inner_steps: int
    extra_inner_steps: int
    datasets: int
    window: int
    threshold: float
    practice: str | None
    evaluate: str | None
    reward_questions: int
    outer_reward: str  # grounded | intrinsic

    @classmethod
    def of(cls, exp: ir.Experiment) -> Settings:
        assert exp.schedule is not None
        o = exp.schedule.options
        return cls(outer=str(o.get("outer")), inner=str(o.get("inner")), copies=int(o.get("copies") or 1),
                   inner_steps=int(o.get("inner_steps") or 1), extra_inner_steps=int(o.get("extra_inner_steps") or 0),
                   datasets=int(o.get("datasets") or 1), window=int(o.get("promotion_window") or 1),
                   threshold=float(o.get("promotion_threshold") or 0.0), practice=o.get("practice"),
                   evaluate=o.get("evaluate"), reward_questions=int(o.get("reward_questions") or 1),
                   outer_reward=str(o.get("outer_reward") or "grounded"))


@dataclass
class Dataset:
    k: int  # 1-based, over the step's outer sessions
    items: list[dict[str, Any]]
    turns: list[tuple[str, int, int]]  # (session, attempt, turn index) of each reply of the dataset


@dataclass
class CopyResult:
    """What training one copy gives its outer step (InnerLoop.train_copy)."""

    accuracy: float  # on the step's reward questions
    metrics: list[dict[str, Any]]  # each inner step's update metrics (JSON values)
    weights: str  # the trained copy's weights (a file in the work folder)


# (step, dataset, copy, inner steps, reward questions, first session index) -> the trained copy
CopyTrainer = Callable[[int, "Dataset", int, int, list, int], Awaitable[CopyResult]]


@dataclass
class LoopState:
    """What the loop carries from one outer step to the next (checkpointed)."""

    rewards: list[float] = field(default_factory=list)  # mean outer reward per step, the whole run (Alg. 1)
    promotions: list[dict[str, Any]] = field(default_factory=list)  # {step, dataset, copy, items}
    best: dict[str, Any] | None = None  # keep = best(accuracy): {step, dataset, copy, accuracy} of the kept student


def data_name(game: ir.Game) -> str | None:
    """The data set a game's `for` iterates over."""
    found: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, ir.Ref) and x.scope == "data":
            found.append(x.name)
        elif isinstance(x, ir.Node):
            for v in x.__dict__.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(game.iter)
    return found[0] if found else None


def datasets_of(sessions: list, parsed: dict[tuple[str, int], Any], role: str) -> list[Dataset]:
    """The datasets of an outer step: one per `sample` call of `role`, in session order."""
    out: list[Dataset] = []
    for s in sessions:
        if s.status != "ok":
            continue
        dropped = {t for d in s.book.get("dropped") or [] if d.get("role") == role for t in (d.get("turns") or [])}
        last: dict[str, int] = {}  # sample key -> its last turn (a resampled reply's earlier tries come first)
        for r in s.rollouts:
            if r["role"] == role and r.get("sample_key"):
                last[r["sample_key"]] = max(last.get(r["sample_key"], -1), r["turn_index"])
        calls: dict[str, list[int]] = {}
        for key, turn in sorted(last.items(), key=lambda kv: kv[1]):
            calls.setdefault(key.split(".")[0], []).append(turn)
        for turns in calls.values():
            items = []
            for t in turns:
                fields = parsed.get((s.session_id, t))
                if t in dropped or not isinstance(fields, dict):
                    continue
                item = {k: v for k, v in fields.items() if not k.startswith("_")}
                item.setdefault("question", item.get("text"))
                items.append(item)
            out.append(Dataset(len(out) + 1, items, [(s.session_id, s.attempt, t) for t in turns]))
    return out


def median_copy(accuracies: list[float]) -> int:
    """0-based index of the lower-median copy by accuracy (ties: the earlier copy)."""
    order = sorted(range(len(accuracies)), key=lambda j: (accuracies[j], j))
    return order[(len(order) - 1) // 2]


def decide(state: LoopState, mean_reward: float, window: int, threshold: float) -> tuple[float, bool]:
    """Add a step's mean outer reward; (the moving average over the last `window` steps
    of the run, promotions included, whether to promote)."""
    state.rewards.append(mean_reward)
    recent = state.rewards[-window:]
    average = sum(recent) / len(recent)
    return average, average > threshold


class InnerLoop:
    """One outer step's inner loop for a LocalTrainer (see module doc)."""

    def __init__(self, trainer, params: dict[str, Any], collections: dict[str, list]) -> None:
        self.trainer = trainer
        self.s = Settings.of(trainer.exp)
        self.params = params
        self.collections = collections
        self.state = LoopState()
        self.practice = trainer.game_named(self.s.practice) if self.s.practice else None
        self.evaluate = trainer.game_named(self.s.evaluate) if self.s.evaluate else None
        self.keep_best = any(st.kind == "train" and (st.options.get("keep") or {}).get("rule") == "best"
                             for st in trainer.exp.stages)

    @property
    def grounded(self) -> bool:
        return self.s.outer_reward == "grounded"

    def games(self) -> list[str]:
        return [g.name for g in (self.practice, self.evaluate) if g is not None and self.grounded]

    def problems(self) -> list[tuple[str, ir.Span | None]]:
        """What keeps the loop from running, as TrainingRefused problems."""
        out: list[tuple[str, ir.Span | None]] = []
        span = self.trainer.exp.schedule.span
        if self.s.inner == self.s.outer:
            out.append((f"the nested schedule's outer and inner roles are both '{self.s.inner}': the inner copies "
                        f"are trained from the outer role's data, so they must be two roles", span))
        if self.s.inner not in self.trainer.by_role:
            out.append((f"the inner role '{self.s.inner}' of the nested schedule has no train block", span))
        if self.s.outer not in self.trainer.by_role:
            out.append((f"the outer role '{self.s.outer}' of the nested schedule has no train block", span))
        for game in (self.practice, self.evaluate):
            if self.grounded and game is not None and (not game.pattern or data_name(game) is None):
                out.append((f"game {game.name}: the nested schedule plays it over items it chooses, so it must be "
                            f"written `game {game.name} for x in DATA`", game.span))
        return out

    # -- sizes -------------------------------------------------------------------------------

    def _practice_phase(self) -> ir.TrainPhase:
        """The practice game's groups and sessions per inner step (the IR's inner phase)."""
        phase = self.trainer.exp.inner_phase
        assert phase is not None  # lowered for every nested schedule with a practice game
        return phase

    def _eval_items(self) -> int:
        assert self.evaluate is not None
        return min(self.s.reward_questions, len(self.collections.get(data_name(self.evaluate) or "", [])))

    def max_sessions(self) -> int:
        """The most inner sessions one outer step plays (its share of session indices)."""
        if not self.grounded:
            return 0
        steps = self.s.inner_steps + self.s.extra_inner_steps
        per_copy = steps * self._practice_phase().batch + self._eval_items()
        return self._eval_items() + self.s.datasets * self.s.copies * per_copy

    # -- checkpoints -------------------------------------------------------------------------

    def save(self, root: Path, step: int) -> None:
        from askspec.runtime.store.layout import write_json_atomic

        (root / NESTED).mkdir(parents=True, exist_ok=True)
        write_json_atomic(root / NESTED / f"step-{step}.json", dataclasses.asdict(self.state))
        for old in (root / NESTED).glob("step-*.json"):
            if old.stem[5:].isdigit() and int(old.stem[5:]) < step:
                old.unlink(missing_ok=True)
        kept = best_weights(self.kept_root(), self.state.best["step"]) if self.state.best is not None else None
        for old in self.kept_root().glob("best-step-*.safetensors"):  # only the newest checkpoint's state resumes
            if old != kept:
                old.unlink(missing_ok=True)

    def restore(self, root: Path, step: int) -> None:
        path = root / NESTED / f"step-{step}.json"
        if path.exists():
            self.state = LoopState(**json.loads(path.read_text(encoding="utf-8")))

    # -- the loop ----------------------------------------------------------------------------

    async def run(self, step: int, index0: int, engine, log, sessions: list) -> dict[str, Any]:
        """The inner loop of outer step `step` (its sessions numbered from `index0`); writes
        the outer rewards into `log` and returns a summary for the outer role's metrics."""
        datasets = datasets_of(sessions, log.parsed, self.s.outer)
        if not self.grounded:
            return {"datasets": len(datasets), "outer_reward": "intrinsic"}
        outer_log = (log.sessions, log.routes, log.parsed)
        try:
            summary = await self.outer_step(step, index0, engine, log, datasets)
        finally:
            log.sessions, log.routes, log.parsed = outer_log
        for ds, r_k in zip(datasets, summary["outer_rewards"]):
            for sid, attempt, turn in ds.turns:
                log.reward(sid, attempt, role=self.s.outer, turn_index=turn, name="grounded", value=r_k, kind="turn")
        return summary

    async def outer_step(self, step: int, index0: int, engine, log, datasets: list[Dataset],
                         train: CopyTrainer | None = None) -> dict[str, Any]:
        """Steps 2-5 of the module doc for one outer step's datasets: R_k per dataset
        (`outer_rewards`, in dataset order) and the promotion decision, with the
        nested_events written to `log`; the loop's state and the inner role's weights are
        updated. The one computation of R_k: the local schedule (run) and the cluster's
        inner-loop service (targets/openrlhf/inner_loop.py) both call it. `train` trains
        the copies elsewhere (the service's pool of Ray workers, each calling `train_copy`);
        its copies are all started first and gathered in (dataset, copy) order. Without it
        each copy is `train_copy` here, one after the other."""
        t = self.trainer
        self._cursor = index0
        work = self.work_root()
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        assert self.evaluate is not None
        pool = self.collections.get(data_name(self.evaluate) or "", [])
        rng = random.Random(derive_seed(t.seed, "nested-reward-questions", step))
        questions = rng.sample(list(pool), self._eval_items())
        student = t.policies[self.s.inner]
        try:
            base = await self._accuracy(step, "base", questions, engine, log)
            log.nested_event(step=step, event="baseline", value=base, data={"questions": len(questions)})
            rewards: list[float] = []
            # the best dataset so far: (k, median copy, its weights, its accuracy)
            best: tuple[int, int, Path | None, float] | None = None
            steps = self.s.inner_steps + (self.s.extra_inner_steps if self.state.promotions else 0)
            jobs = [(ds, j) for ds in datasets if ds.items for j in range(1, self.s.copies + 1)]
            started = {(ds.k, j): asyncio.ensure_future(train(step, ds, j, steps, questions, self.copy_index0(index0, ds.k, j)))
                       for ds, j in jobs} if train is not None else {}
            gathered: set[Path] = set()
            try:
                for ds in datasets:
                    accs: list[float] = []
                    files: list[Path | None] = []
                    for j in range(1, self.s.copies + 1):
                        if not ds.items:  # nothing to train on: the copy is the baseline
                            accs.append(base)
                            files.append(None)
                            continue
                        done = await (started[(ds.k, j)] if started else
                                      self.train_copy(step, ds, j, steps, questions, self.copy_index0(index0, ds.k, j),
                                                      engine, log))
                        for i, m in enumerate(done.metrics, 1):
                            log.nested_event(step=step, event="inner_step", dataset=ds.k, copy=j, inner_step=i,
                                             value=m.get("loss"), data=m)
                        accs.append(done.accuracy)
                        log.nested_event(step=step, event="copy", dataset=ds.k, copy=j, value=done.accuracy,
                                         data={"reward": done.accuracy - base, "steps": steps})
                        files.append(Path(done.weights))
                    r_k = sum(a - base for a in accs) / len(accs)
                    rewards.append(r_k)
                    med = median_copy(accs)
                    log.nested_event(step=step, event="dataset", dataset=ds.k, value=r_k,
                                     data={"accuracies": accs, "baseline": base, "median_copy": med + 1,
                                           "items": ds.items})
                    if best is None or r_k > rewards[best[0] - 1]:
                        best = (ds.k, med + 1, files[med], accs[med])
                    # only the best dataset's median copy may be promoted (a pool's later copies wait)
                    gathered.update(f for f in files if f is not None)
                    for f in gathered:
                        if best[2] is None or f != best[2]:
                            f.unlink(missing_ok=True)
            finally:
                for fut in started.values():
                    fut.cancel()
            mean = sum(rewards) / len(rewards) if rewards else 0.0
            average, promote = decide(self.state, mean, self.s.window, self.s.threshold)
            promote = promote and best is not None
            log.nested_event(step=step, event="decision", value=average,
                             data={"mean_reward": mean, "moving_average": average, "threshold": self.s.threshold,
                                   "window": self.s.window, "promoted": promote,
                                   "best_dataset": best[0] if best else None, "rewards": rewards})
            if promote and best is not None:
                k_best, j_star, weights, accuracy = best
                if weights is not None:  # else the best dataset had no items: its copies are the baseline
                    student.take_weights(_load_weights(weights))
                record = {"step": step, "dataset": k_best, "copy": j_star, "items": datasets[k_best - 1].items}
                self.state.promotions.append(record)
                log.nested_event(step=step, event="promotion", dataset=k_best, copy=j_star, value=rewards[k_best - 1],
                                 data=record)
                if self.keep_best and (self.state.best is None or accuracy > self.state.best["accuracy"]):
                    self._keep(student, {"step": step, "dataset": k_best, "copy": j_star, "accuracy": accuracy})
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return {"datasets": len(datasets), "baseline_accuracy": base, "outer_rewards": rewards,
                "moving_average": average, "promoted": promote, "inner_steps": steps}

    def copy_index0(self, index0: int, k: int, j: int) -> int:
        """The first session index of copy j of dataset k in the outer step whose sessions
        start at `index0`: a range of its own after the baseline's (max_sessions), so a
        copy's sessions are numbered alike whichever process trains it, and in what order."""
        per_copy = (self.s.inner_steps + self.s.extra_inner_steps) * self._practice_phase().batch + self._eval_items()
        return index0 + self._eval_items() + ((k - 1) * self.s.copies + (j - 1)) * per_copy

    def work_root(self) -> Path:
        """Where the copies' weights wait for the step's promotion decision."""
        return self.trainer.run_dir / CHECKPOINTS / NESTED / "work"

    async def train_copy(self, step: int, ds: Dataset, j: int, steps: int, questions: list, index0: int,
                         engine, log) -> CopyResult:
        """Step 3 of the module doc for copy j of dataset `ds`: a fork of the inner role's
        current weights trained `steps` inner steps on the dataset's items (its sessions
        numbered from `index0`), evaluated on `questions`, its weights saved in the work
        folder (`d<k>-c<j>.safetensors`). The seeds follow (step, k, j) alone, so the copy
        is the same whether the local schedule or a worker of the service's pool trains it."""
        t = self.trainer
        self._cursor = index0
        student = t.policies[self.s.inner]
        copy = student.fork()
        t.policies[self.s.inner] = copy  # the copy serves the inner role and current(inner)
        metrics: list[dict[str, Any]] = []
        try:
            for i in range(1, steps + 1):
                metrics.append(jsonable(await self._inner_step(step, ds, j, i, copy, engine, log)))
            acc = await self._accuracy(step, f"d{ds.k}c{j}", questions, engine, log)
        finally:
            t.policies[self.s.inner] = student
            await copy.release()  # its backend's worker thread holds the weights
        path = self.work_root() / f"d{ds.k}-c{j}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        _save_weights(copy.state(), path)
        del copy
        gc.collect()  # the copy's weights and AdamW state go before the next copy is made
        return CopyResult(acc, metrics, str(path))

    def kept_root(self) -> Path:
        """Where keep = best(accuracy) keeps promoted students: beside the inner loop's work
        folder, in the trainer's run directory (set once the run's folder exists)."""
        return self.trainer.run_dir / CHECKPOINTS / NESTED

    def _keep(self, student, best: dict[str, Any]) -> None:
        """The promoted student is the most accurate so far: its weights are kept (the one
        kept before goes with the next checkpoint, which no longer names it: `save`)."""
        _save_weights(student.state(), best_weights(self.kept_root(), best["step"]))
        self.state.best = best

    def kept_weights(self) -> dict | None:
        """The kept student's weights (keep = best(accuracy)), None when none was promoted."""
        if self.state.best is None:
            return None
        return _load_weights(best_weights(self.kept_root(), self.state.best["step"]))

    def _plans(self, game: ir.Game, items: list, groups: Mapping[str, int], batch: int, seed: int, step: int,
               tag: str, n: int = 1) -> list[SessionPlan]:
        """The sessions of the `n`-th step of `game` over `items` (cycling), numbered on
        from the step's cursor; group ids tagged so no two inner phases share one."""
        name = data_name(game) or ""
        planner = self.trainer.planner_over([game], {**self.collections, name: items}, seed, groups, batch)
        plans = planner.plans(n, self._cursor, step)
        # the inner loop's sessions belong to the train stage, as the outer ones do
        stage = next((s.name for s in self.trainer.exp.stages if s.kind == "train"), None)
        self._cursor += len(plans)
        return [dataclasses.replace(p, stage=stage,
                                    group_id=p.group_id and p.group_id.replace(f"-t{step:06d}-", f"-t{step:06d}-{tag}-"))
                for p in plans]

    async def _accuracy(self, step: int, tag: str, questions: list, engine, log) -> float:
        """The mean `score` of the evaluate game over `questions`, served by the inner role's
        current policy (the baseline or a copy)."""
        assert self.evaluate is not None
        if not questions:
            return 0.0
        plans = self._plans(self.evaluate, questions, {self.evaluate.name: self.evaluate.group_size}, len(questions),
                            derive_seed(self.trainer.seed, "eval", step, tag), step, tag)
        log.reset()
        await engine.run_phase(plans)
        scores = []
        for p in plans:
            rec = log.sessions.get(p.session_id)
            v = rec.vars.get("score") if rec is not None and rec.status == "ok" else None
            scores.append(float(v) if isinstance(v, (int, float)) else 0.0)
        return sum(scores) / len(scores)

    async def _inner_step(self, step: int, ds: Dataset, j: int, i: int, copy, engine, log) -> dict[str, Any]:
        from askspec.runtime.train.batch import build_batch

        assert self.practice is not None
        phase = self._practice_phase()
        # the copy's i-th step takes the next elements of the dataset (the planner cycles it)
        plans = self._plans(self.practice, ds.items, phase.groups, phase.batch,
                            derive_seed(self.trainer.seed, "nested", step, ds.k, j), step, f"d{ds.k}c{j}i{i}", n=i)
        log.reset()
        await engine.run_phase(plans)
        sessions = [log.sessions[p.session_id] for p in plans if p.session_id in log.sessions]
        b = build_batch(self.s.inner, sessions, log.routes)
        m = copy.update(b.trajectories)
        m.update(sessions=len(plans), excluded=b.excluded)
        return m


def best_weights(root: Path, step: int) -> Path:
    """Where keep = best(accuracy) keeps the student promoted at `step` (root: InnerLoop.kept_root)."""
    return root / f"best-step-{step}.safetensors"


def _save_weights(state: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(path))


def _load_weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))
