"""Trajectories from one step's sessions: which tokens a trained role is trained on, with
which reward, in which group.

A **trajectory** is one session's conversation of the role (its non-`sample` turns, which
share the role's memory), or one reply of a `sample N ask` (each sibling its own
single-turn trajectory). Each turn is a row: the prompt token ids the model saw (other
roles' text, templates and environment feedback are in there, as context only), the
completion ids it produced (the loss mask covers exactly these) and their log-probs at
sampling time (the "old" policy).

**Rewards** (one scalar per trajectory, as the language reference states):
- a conversation trajectory gets the role's terminal rewards of the session plus the
  per-turn rewards of its own turns (a plain sum, undiscounted: AskBench's §4.2 defines
  turn and terminal rewards without their combination, and its spec names the sum as
  ours);
- a `sample` trajectory gets the per-turn rewards of its turn, plus the session's
  terminal rewards when the role has no conversation turns in that session;
- when a `route` replaced the group's rewards (tournament / judge), the routed value is
  the trajectory's terminal reward and the role's other terminal rewards are ignored.

**Exclusions** (counted in the step's metrics): sessions that ended in error; groups a
route dropped (or whose route failed); `drop ROLE` (the role's whole session) and
`drop x` (those turns); trajectories left without any turn or without any reward
(sft: without a reward is fine).

**Groups**: `sample` siblings form one group; conversation trajectories are grouped by
the session's group (the game's `sample N`, or the trainer's repeats of one element).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from askspec.ir.vocab import CONTEST_ROUTES, reward_counts

ROUTED = CONTEST_ROUTES  # the reward names a routed contest records


@dataclass
class Turn:
    session_id: str
    attempt: int
    turn_index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    temperature: float
    finish_reason: str
    policy_version: int | None = None  # updates the sampling weights had seen (None: the trained weights')


@dataclass
class Trajectory:
    key: str
    group_key: str
    reward: float | None
    turns: list[Turn] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)


@dataclass
class SessionRecord:
    """What the step recorded about one session (see steplog.StepLog)."""

    session_id: str
    group_id: str | None
    attempt: int = 1
    status: str | None = None
    vars: dict[str, Any] = field(default_factory=dict)
    book: dict[str, Any] = field(default_factory=dict)  # the engine's bookkeeping (SessionBook.to_json)
    rewards: list[tuple[str, int | None, str, float]] = field(default_factory=list)  # role, turn, name, value
    rollouts: list[dict[str, Any]] = field(default_factory=list)  # role, turn_index, sample_key, ... (per turn)
    outcome: str | None = None  # what an update gate sees as `outcome`


@dataclass
class Batch:
    trajectories: list[Trajectory]
    excluded: dict[str, int]


def build_batch(role: str, sessions: list[SessionRecord], routes: dict[tuple[str, str], str],
                need_reward: bool = True) -> Batch:
    """The role's trajectories in `sessions`; `routes[(group_id, role)]` is the route a
    group took for the role ("keep", "drop", "tournament:arena", "error", ...)."""
    excluded = {"error_sessions": 0, "dropped_groups": 0, "resampled_groups": 0, "dropped_sessions": 0, "dropped_turns": 0,
                "unrewarded": 0}
    out: list[Trajectory] = []
    for s in sessions:
        rows = [r for r in s.rollouts if r["role"] == role]
        if not rows:
            continue
        if s.status != "ok":
            excluded["error_sessions"] += 1
            continue
        route = (routes.get((s.group_id, role)) or routes.get((s.group_id, "*")) or "keep") if s.group_id else "keep"
        if route in ("drop", "error", "resample"):
            excluded["resampled_groups" if route == "resample" else "dropped_groups"] += 1
            continue
        drops = [d for d in s.book.get("dropped") or [] if d.get("role") == role]
        if any(d.get("turns") is None for d in drops):
            excluded["dropped_sessions"] += 1
            continue
        dropped_turns = {t for d in drops for t in (d.get("turns") or [])}
        routed = route.split(":", 1)[0] in ROUTED
        mine = [(turn, name, value) for r, turn, name, value in s.rewards if r == role]
        terminal = [v for turn, name, v in mine if turn is None and reward_counts(turn, name, routed)]
        per_turn: dict[int, list[float]] = {}
        for turn, name, value in mine:
            if turn is not None:
                per_turn.setdefault(turn, []).append(value)
        trajs: dict[str, Trajectory] = {}
        is_sample: dict[str, bool] = {}
        for r in sorted(rows, key=lambda r: r["turn_index"]):
            sample = r.get("sample_key")
            key = f"{s.session_id}/{role}" + (f"/{sample}" if sample else "")
            group = f"{s.session_id}/{role}/{sample.split('.')[0]}" if sample else (s.group_id or s.session_id)
            t = trajs.setdefault(key, Trajectory(key, group, None))
            is_sample[key] = bool(sample)
            if r["turn_index"] in dropped_turns:
                excluded["dropped_turns"] += 1
                t.reward = _add(t.reward, per_turn.get(r["turn_index"]))  # its reward still counts
                continue
            t.turns.append(Turn(s.session_id, s.attempt, r["turn_index"], list(r["prompt_ids"]), list(r["completion_ids"]),
                                list(r["logprobs"]), float(r["temperature"]), r["finish_reason"],
                                r.get("policy_version")))
            t.reward = _add(t.reward, per_turn.get(r["turn_index"]))
        has_conversation = not all(is_sample.values())
        for key, t in trajs.items():
            if terminal and (not is_sample[key] or not has_conversation):
                t.reward = _add(t.reward, terminal)
            if not t.turns:
                continue
            if t.reward is None and need_reward:
                excluded["unrewarded"] += 1
                continue
            out.append(t)
    return Batch(out, excluded)


def _add(total: float | None, values: list[float] | None) -> float | None:
    if not values:
        return total
    return (total or 0.0) + float(sum(values))
