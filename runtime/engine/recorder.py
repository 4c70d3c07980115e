"""The events the engine records, as a protocol: the run store's `RunWriter` is the real
one; a benchmark or a unit test may pass anything with these methods."""

from __future__ import annotations

from typing import Any, Protocol


class Recorder(Protocol):
    def session_started(self, session_id: str, *, game: str, group_id: str | None, params: dict, index: int,
                        step: int | None = None, stage: str | None = None, weights: str | None = None,
                        seed: int | None = None) -> int:
        """Returns the session's attempt number (1, 2, ... across resumes). `params` are the
        session's bindings; `step`, `stage` and `weights` its plan's (a training run's);
        `seed` its plan's sampling seed (every run's)."""
        ...

    def turn(self, session_id: str, attempt: int, *, turn_index: int, role: str, model: str | None, prompt: Any,
             text: str | None, parsed: dict | None, finish_reason: str | None, tokens_in: int | None,
             tokens_out: int | None, latency_ms: float | None, error: str | None = None,
             group_id: str | None = None, ttft_ms: float | None = None) -> None:
        """A model call. A group's judge call has `group_id` set and the group's id as its
        session id; `ttft_ms` is the time to the first token where the backend reports it."""
        ...

    def reward(self, session_id: str, attempt: int, *, role: str, turn_index: int | None, name: str, value: float,
               kind: str) -> None: ...

    def session_finished(self, session_id: str, attempt: int, *, status: str, outcome: str | None, error: str | None,
                         vars: dict, bookkeeping: dict | None = None) -> None: ...

    def group(self, group_id: str, *, route: str, stats: dict, members: list[str], judge_calls: int | None = None,
              unparsed: int | None = None) -> None: ...

    def match(self, group_id: str, *, a: str, b: str, first_shown: str, verdict: str | None, outcome: float | None,
              raw: str | None) -> None: ...

    def buffer_event(self, *, buffer: str, event: str, item: int, value: Any = None, reason: str | None = None,
                     score: float | None = None, best: float | None = None, replays: int | None = None,
                     step: int | None = None, phase: str | None = None) -> None:
        """A buffer's push, replay, eviction... (`step`/`phase`: a training run's, else None)."""
        ...
