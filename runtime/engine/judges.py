"""The engine's judge client for group routing (`routing.JudgeClient`): a judge role's
system prompt and merged sampling, a seed derived per contest call, and every call
recorded as a turn of the judge role. Such a turn's `session_id` is the group's id and
its `group_id` is set; a call that fails for good is recorded with its error."""

from __future__ import annotations

from typing import Any, Callable

from askspec.ir import model as ir

from askspec.runtime.backends.base import BackendError, ChatRequest, Sampling
from askspec.runtime.engine.calls import ModelCalls
from askspec.runtime.engine.plan import derive_seed
from askspec.runtime.engine.routing import JudgeReply
from askspec.runtime.engine.state import ModelBinding


class EngineJudges:
    def __init__(self, calls: ModelCalls, roles: dict[str, ir.Role], resolve_model: Callable[[str, str | None], ModelBinding],
                 render: Callable[[str, dict[str, Any]], str], params: dict[str, Any], seed: int) -> None:
        self.calls, self.roles, self.resolve_model = calls, roles, resolve_model
        self._render, self.params, self.seed = render, params, seed
        self._turns: dict[str, int] = {}  # group id -> judge turns so far

    def render(self, template: str, ctx: dict[str, Any]) -> str:
        return self._render(template, ctx)

    async def call(self, role: str, prompt: str, parse: Callable[[str], Any], *, group_id: str, session_index: int,
                   call_index: int) -> JudgeReply:
        r = self.roles[role]
        binding = self.resolve_model(role, r.model)
        base, _ = self.calls.sampling(role, r, binding)
        samp = Sampling(seed=derive_seed(self.seed, "judge", session_index, call_index), **base)
        messages = []
        if r.system is not None:
            messages.append({"role": "system", "content": self._render(r.system, dict(self.params))})
        messages.append({"role": "user", "content": prompt})
        stream = self.calls.stream()
        req = ChatRequest(messages=tuple(messages), sampling=samp, model=binding.weights, role=role,
                          session_index=session_index, call_index=call_index, on_tokens=stream)
        turn_index = self._turns.get(group_id, 0)
        self._turns[group_id] = turn_index + 1
        try:
            result, latency = await self.calls.complete(binding, req)
        except BackendError as e:  # a judge that is down is seen in `turns` too
            self.calls.record_failure(group_id, 1, turn_index, role, binding, messages, str(e), group_id=group_id)
            raise
        value = parse(result.text)
        self.calls.record(group_id, 1, turn_index, role, binding, messages, result,
                          {"verdict": value, "parsed": value is not None}, latency, group_id=group_id,
                          streamed=stream.count if stream is not None else 0)
        return JudgeReply(result.text, value)
