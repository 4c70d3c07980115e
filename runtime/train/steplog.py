"""What a training step recorded: `StepWriter`, the run writer the trainer records through
(the engine's events plus `train_step`, `nested_event`, `flush`), and `StepLog`, which
passes every event through while keeping what the step's update needs (each session's
status, variables, rewards and rollouts, and the groups' routes)."""

from __future__ import annotations

import math
from typing import Any, Protocol

from askspec.runtime.engine.plan import SessionPlan
from askspec.runtime.engine.recorder import Recorder
from askspec.runtime.train.batch import SessionRecord


class StepWriter(Recorder, Protocol):
    """What a training run records beyond the engine's events (the run store's RunWriter)."""

    @property
    def run_id(self) -> str: ...

    @property
    def generation(self) -> int: ...

    def train_step(self, role: str, step: int, metrics: dict) -> None: ...

    def nested_event(self, *, step: int, event: str, dataset: int | None = None, copy: int | None = None,
                     inner_step: int | None = None, value: float | None = None, data: Any = None) -> None: ...

    def flush(self) -> None: ...


class StepLog:
    """The run writer, passed through, keeping what the trainer needs from the current
    step: each session's status, variables, rewards and rollouts, and the groups' routes.
    It is the engine's Recorder and the trainer's StepWriter: every event is forwarded."""

    def __init__(self, writer: StepWriter) -> None:
        self._writer = writer
        self.sessions: dict[str, SessionRecord] = {}
        self.routes: dict[tuple[str, str], str] = {}
        self.parsed: dict[tuple[str, int], Any] = {}  # (session, turn index) -> the reply's fields (nested datasets)

    # forwarded as they are
    @property
    def run_id(self) -> str:
        return self._writer.run_id

    @property
    def generation(self) -> int:
        return self._writer.generation

    def train_step(self, role: str, step: int, metrics: dict) -> None:
        self._writer.train_step(role, step, metrics)

    def nested_event(self, **fields: Any) -> None:
        self._writer.nested_event(**fields)

    def buffer_event(self, **fields: Any) -> None:
        self._writer.buffer_event(**fields)

    def match(self, group_id: str, **fields: Any) -> None:
        self._writer.match(group_id, **fields)

    def flush(self) -> None:
        self._writer.flush()

    def reset(self) -> None:
        self.sessions, self.routes, self.parsed = {}, {}, {}

    def turn(self, session_id: str, attempt: int, **fields: Any) -> None:
        self._writer.turn(session_id, attempt, **fields)
        parsed = fields.get("parsed")
        if session_id in self.sessions and isinstance(parsed, dict):
            self.parsed[(session_id, int(fields["turn_index"]))] = {"text": fields.get("text"), **parsed}

    def session_started(self, session_id: str, *, game: str, group_id: str | None, params: dict, index: int,
                        step: int | None = None, stage: str | None = None, weights: str | None = None,
                        seed: int | None = None) -> int:
        attempt = self._writer.session_started(session_id, game=game, group_id=group_id, params=params, index=index,
                                               step=step, stage=stage, weights=weights, seed=seed)
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
            rec.status, rec.outcome, rec.vars, rec.book = status, outcome, vars, bookkeeping or {}

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


def jsonable(v: Any) -> Any:
    """A step's metrics as the run store and a checkpoint's state hold them: keys as
    strings, tuples as lists, a NaN or infinite number as null."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
