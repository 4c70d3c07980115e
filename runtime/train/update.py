"""A played step's update: each trained role's batch from the step's sessions, the update
itself or why it was skipped (an empty buffer, the spec's `update_when` gate), the step's
metrics per role, the rollout rows its shard records, and which roles' sampler did not
play the weights being trained (`max_mismatch`). The trainer (trainer.py) plays the step,
calls these, then checkpoints (checkpoints.py) and reports (steplog.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from askspec.ir import model as ir

from askspec.runtime.engine.plan import SessionPlan
from askspec.runtime.train import schedule
from askspec.runtime.train.batch import SessionRecord, build_batch
from askspec.runtime.train.config import TrainConfig

Metrics = dict[str, dict[str, Any]]  # role -> the step's metrics (a train_steps event's)
TurnKeys = dict[tuple[str, int], tuple[str, str]]  # (session, turn) -> (trajectory, group)


@dataclass
class Played:
    """What playing a step left for its update and its rollout shard."""

    plans: list[SessionPlan]
    sessions: list[SessionRecord]
    routes: dict[tuple[str, str], str]  # the step's (StepLog.routes; a later step's reset leaves it)
    nested: Any  # the inner loop's summary (nested schedule)
    versions: dict[str, int]  # role -> the policy version that sampled its rollouts
    t0: float
    seconds: float


def update_roles(sl: schedule.Slot, played: Played, configs: Mapping[str, TrainConfig], policies: Mapping[str, Any],
                 gate: Callable[[str], str | None]) -> tuple[Metrics, TurnKeys]:
    """Update every role of step `sl` on its played sessions: the step's metrics per role,
    and each trained turn's (trajectory, group). `gate(role)` says why the role's update
    gate skips the step (None: open)."""
    plans, sessions, nested = played.plans, played.sessions, played.nested
    metrics: Metrics = {}
    keys: TurnKeys = {}
    for role in sl.phase.roles:
        cfg, policy = configs[role], policies[role]
        if sl.n > cfg.steps:  # online: this role's own steps are done
            continue
        batch = build_batch(role, sessions, played.routes, need_reward=cfg.loss != "sft")
        if nested is not None:  # the outer role's group: every dataset of its session
            for tr in batch.trajectories:
                tr.group_key = tr.key.split("/")[0] + "/outer"
        for tr in batch.trajectories:
            for turn in tr.turns:
                keys[(turn.session_id, turn.turn_index)] = (tr.key, tr.group_key)
        closed = gate(role) if plans else None
        version = policy.version
        if not plans:  # an empty buffer: nothing was played (PasoDoble ends the phase's step)
            m: dict[str, Any] = {"skipped": "empty_buffer", "skip_reason": "the replayed buffer is empty",
                                 "trajectories": 0, "tokens": 0}
        elif closed is not None:  # the spec's update gate said no (PasoDoble: no valid question)
            from askspec.runtime.train.policy import batch_reward_stats

            m = {**batch_reward_stats(batch.trajectories, cfg.std), "skipped": "gate", "skip_reason": closed,
                 "gate": False, "tokens": 0}
        else:
            m = policy.update(batch.trajectories)
        generated = sum(len(r["completion_ids"]) for s in sessions for r in s.rollouts if r["role"] == role)
        m.update(step=sl.step, iteration=sl.iteration, phase=sl.phase.name, stage=sl.phase.stage,
                 algorithm=cfg.algorithm, generated_tokens=generated,
                 sessions=len(plans), seconds_play=played.seconds, seconds=time.perf_counter() - played.t0,
                 policy_version=version, excluded=batch.excluded)
        if cfg.max_staleness:
            m["sampling_version"] = played.versions[role]
        if nested is not None:
            m["nested"] = nested
        metrics[role] = m
    return metrics, keys


def gate_reason(exp: ir.Experiment, gate: ir.Expr | None, plans: list[SessionPlan],
                sessions: list[SessionRecord]) -> str | None:
    """Why an update gate (`update_when`) skips this step's update, or None when it is open
    (or absent). Evaluated over the step's finished sessions as a metric is over a run's:
    session variables, bindings, outcome, status, game, total rewards."""
    from askspec.runtime.engine.metrics import gate_closed, gate_scope

    if gate is None:
        return None
    by_id = {p.session_id: p for p in plans}
    scopes = []
    for s in sessions:
        if s.status != "ok":
            continue
        plan = by_id[s.session_id]
        assert plan.step is not None  # a training step's plans carry it
        totals: dict[str, float] = {}
        for r, _, _, value in s.rewards:
            totals[r] = totals.get(r, 0.0) + value
        scopes.append(gate_scope(s.vars, plan.bindings, step=plan.step, outcome=s.outcome, status=s.status,
                                 game=plan.game, rewards=totals))
    return gate_closed(exp, gate, scopes)


def rollout_rows(run_id: str, generation: int, step: int, played: Played, keys: TurnKeys) -> list[dict[str, Any]]:
    """Step `step`'s rollout shard rows: every turn of a trained role, token by token."""
    rows = []
    for s in played.sessions:
        for r in s.rollouts:
            traj, group = keys.get((s.session_id, r["turn_index"]), (None, None))
            rows.append({"run_id": run_id, "session_id": s.session_id, "attempt": s.attempt,
                         "turn_index": r["turn_index"], "role": r["role"], "step": step, "trajectory": traj,
                         "group_key": group, "policy_version": played.versions[r["role"]],
                         "temperature": r["temperature"], "finish_reason": r["finish_reason"],
                         "prompt_ids": list(r["prompt_ids"]), "completion_ids": list(r["completion_ids"]),
                         "logprobs": list(r["logprobs"]), "gen": generation})
    return rows


def mismatched_roles(metrics: Metrics, bound_of: Callable[[str], float]) -> list[str]:
    """The roles whose step's sampler-trainer KL (policy._Mismatch, on-policy tokens only)
    exceeds its bound (`bound_of(role)`: `max_mismatch`); each such step's metrics say so in
    `mismatch_warning` (the step's line and the closing summary show it)."""
    out = []
    for role, m in metrics.items():
        kl = m.get("mismatch_kl")
        if kl is None:  # no on-policy token (a skipped step, stale rows only)
            continue
        bound = bound_of(role)
        if not kl <= bound:  # a NaN KL is past any bound
            m["mismatch_warning"] = (f"step {m.get('step')}: the sampler-trainer mismatch of on-policy tokens is "
                                     f"KL {kl:.2e} (mean |Δ log π| {m.get('mismatch_abs') or 0.0:.2e}), above "
                                     f"max_mismatch = {bound:g}")
            out.append(role)
    return out
