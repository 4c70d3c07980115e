"""One model call: a role's merged sampling settings on its model, the per-call seed,
the backend request, the parsed reply and the turn it leaves in the run store.

A session's turns and a group's judge calls both go through `ModelCalls`, so every model
call is recorded the same way, in one place (where a trainer's rollout records — token
ids, log-probs — attach)."""

from __future__ import annotations

import time
import zlib
from typing import Any, Callable

from askspec.ir import model as ir

from askspec.runtime.backends.base import ChatRequest, ChatResult, Sampling
from askspec.runtime.engine.recorder import Recorder
from askspec.runtime.engine.state import ModelBinding
from askspec.runtime.replies import parsers


class TokenStream:
    """One call's tokens as its backend generates them (`ChatRequest.on_tokens`): counted
    and passed on to the progress display. Called from the backend's thread; `count` is
    read on the loop once the call has returned (the last report happens before)."""

    __slots__ = ("sink", "count")

    def __init__(self, sink: Callable[[int], None]) -> None:
        self.sink = sink
        self.count = 0

    def __call__(self, n: int) -> None:
        self.count += n
        self.sink(n)


# on_turn(role, tokens_in, tokens_out, streamed, unparsed, truncated): a recorded call, how
# many of its tokens_out were already reported while it ran, whether its reply did not parse
# (the role's parser, a judge's verdict) and whether it was cut at max_tokens
TurnListener = Callable[[str, int, int, int, bool, bool], None]


class ModelCalls:
    def __init__(self, recorder: Recorder, on_turn: TurnListener | None = None,
                 on_tokens: Callable[[int], None] | None = None,
                 defaults: dict[str, Any] | None = None) -> None:
        self.recorder = recorder
        self.defaults = dict(defaults or {})  # the IR's sampling_defaults: under every model's and role's fields
        self.on_turn = on_turn  # each recorded call's token counts (progress display, run summary)
        self.on_tokens = on_tokens  # tokens as they are generated (thread-safe)
        self._sampling: dict[tuple[str, str], tuple[dict[str, Any], int | None]] = {}

    def stream(self) -> TokenStream | None:
        """What a request reports its tokens to while it runs (None: nobody listens, and
        the hot path allocates nothing)."""
        return TokenStream(self.on_tokens) if self.on_tokens is not None else None

    def sampling(self, role: str, r: ir.Role, binding: ModelBinding) -> tuple[dict[str, Any], int | None]:
        """The role's sampling fields on this model (the seed is set per call) and the
        model's own seed, memoised per (role, model)."""
        key = (role, binding.name)
        hit = self._sampling.get(key)
        if hit is None:
            sampling = binding.capped(ir.merged_sampling(self.defaults, binding.sampling, r))
            model_seed = sampling.pop("seed", None)
            stop = sampling.pop("stop", None) or ()
            fields = {k: v for k, v in sampling.items() if k in Sampling.__dataclass_fields__}
            hit = self._sampling[key] = ({"stop": tuple(stop), **fields}, model_seed)
        return hit

    async def complete(self, binding: ModelBinding, req: ChatRequest) -> tuple[ChatResult, float]:
        """One backend call and its latency in ms (the backend's own figure when it has one)."""
        t0 = time.perf_counter()
        result = await binding.backend.complete(req)
        return result, result.latency_ms or (time.perf_counter() - t0) * 1000

    def record(self, session_id: str, attempt: int, turn_index: int, role: str, binding: ModelBinding,
               messages: list[dict], result: ChatResult, parsed: dict, latency_ms: float,
               group_id: str | None = None, streamed: int = 0) -> None:
        """Record a call as a turn (a judge call carries its group); `streamed` of its
        tokens were already reported while it ran."""
        self.recorder.turn(session_id, attempt, turn_index=turn_index, role=role, model=binding.label or binding.name, prompt=messages,
                           text=result.text, parsed=parsed, finish_reason=result.finish_reason,
                           tokens_in=result.tokens_in, tokens_out=result.tokens_out, latency_ms=round(latency_ms, 3),
                           group_id=group_id, ttft_ms=None if result.ttft_ms is None else round(result.ttft_ms, 3))
        if self.on_turn:
            self.on_turn(role, result.tokens_in or 0, result.tokens_out or 0, streamed, parsed.get("parsed") is False,
                         result.finish_reason == "length")

    def record_failure(self, session_id: str, attempt: int, turn_index: int, role: str, binding: ModelBinding,
                       messages: list[dict], error: str, group_id: str | None = None) -> None:
        """Record a call that failed for good (the backend gave up) as a turn with its error."""
        self.recorder.turn(session_id, attempt, turn_index=turn_index, role=role, model=binding.label or binding.name, prompt=messages,
                           text=None, parsed=None, finish_reason="error", tokens_in=None, tokens_out=None,
                           latency_ms=None, error=error, group_id=group_id)


_ROLE_CRC: dict[str, int] = {}  # a role name's crc32 (a spec has a handful of roles)
_M64 = 0xFFFFFFFFFFFFFFFF


def call_seed(session_seed: int, role: str, call_index: int, model_seed: int | None) -> int:
    """Per-call sampling seed: a splitmix64 mix of the session seed, the role, the call
    number and the model's own seed (stable across processes, unlike hash())."""
    return seed_from_part(role_seed_part(role, model_seed), session_seed, call_index)


def role_seed_part(role: str, model_seed: int | None) -> int:
    """What the role and the model add to `call_seed`'s sum, the same on every call (the
    engine keeps it per role and model, for `seed_from_part`)."""
    crc = _ROLE_CRC.get(role)
    if crc is None:
        crc = _ROLE_CRC[role] = zlib.crc32(role.encode())
    return crc * 0xBF58476D1CE4E5B9 + (model_seed or 0)


def seed_from_part(part: int, session_seed: int, call_index: int) -> int:
    """`call_seed` from its role part (`role_seed_part`)."""
    x = (session_seed * 0x9E3779B97F4A7C15 + part + call_index * 0x94D049BB133111EB) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return (x ^ (x >> 31)) & 0x7FFFFFFF


def parse_reply(parser: ir.ReplyParser, text: str, finish_reason: str) -> dict:
    """Run the role's reply parser; returns {"fields", "ok", "missing"}."""
    fields, ok, missing = reply_fields(parser, text)
    return {"fields": fields, "ok": ok, "missing": missing}


def reply_fields(parser: ir.ReplyParser, text: str) -> tuple[dict[str, Any], bool, list[str]]:
    """`parse_reply` as (fields, ok, missing); the fields (`text` and `answer` among them)
    are a new dict on every call, the caller's to change."""
    return reply_parser(parser)(text)


def reply_parser(parser: ir.ReplyParser) -> Callable[[str], tuple[dict[str, Any], bool, list[str]]]:
    """`reply_fields` for one parser, its arguments checked and prepared once (the engine
    holds it per role)."""
    hit = _COMPILED.get(id(parser))
    if hit is None or hit[0] is not parser:
        hit = _compile(parser)
    return hit[1]


# parsers whose fields are named after the spec's tags: their names are the IR's (the
# checker's, by vocab.tag_field), not named again here
NAMED_TAGS = ("sections", "tags")

# id(ir.ReplyParser) -> (that parser, its `reply_fields`): a role's parser arguments are
# checked and prepared once, not on every reply
_COMPILED: dict[int, tuple[ir.ReplyParser, Callable[[str], tuple[dict[str, Any], bool, list[str]]]]] = {}


def _compile(parser: ir.ReplyParser) -> tuple[ir.ReplyParser, Callable[[str], tuple[dict[str, Any], bool, list[str]]]]:
    if len(_COMPILED) >= 1024:  # many experiments in one process (tests): start over
        _COMPILED.clear()
    named = parser.kind in NAMED_TAGS and bool(parser.fields)  # (an IR without them: the tag rule)
    fields_of = parsers.compile_fields(parser.kind, parser.args, parser.fields if named else None)
    required = tuple(parser.required)
    fallback_answer = parsers.fallback_answer

    def parse(text: str) -> tuple[dict[str, Any], bool, list[str]]:
        # the parser's own verdict, judged before any fallback fills a field (a `boxed`
        # reply without \boxed{} still gets a fallback `answer`, but is not parsed); the
        # spec's required fields pick which of the parts it found missing count
        fields, ok, parts_missing = fields_of(text)
        missing = [] if ok else [f for f in required if f in (parts_missing or ())]
        if not ok and not missing and parser.kind == "json":
            missing = list(parts_missing or required)  # json: every schema problem counts
        if "answer" not in fields:
            fields["answer"] = fallback_answer(text)
        return fields, not missing, missing

    hit = _COMPILED[id(parser)] = (parser, parse)
    return hit
