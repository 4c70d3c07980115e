"""Any OpenAI-compatible chat endpoint (`vllm serve`, SGLang, hosted APIs) via `AsyncOpenAI`.

The client's own retries are off; we retry transient faults (408/409/429, 5xx but 501 and
505, timeouts, dropped connections, and a 200 whose body is not a chat completion) with
jittered exponential backoff (registry.retry_async), then raise BackendError naming the
endpoint. Each call is bounded as a whole: `timeout` caps each attempt from request to
last byte (httpx's own timeout is per read, so a server dripping bytes would never trip
it), `deadline` caps all attempts and backoff sleeps together. The reply body is read
raw and checked here rather than by the client's lenient model construction, so a
malformed body is an error that says what was wrong, never an AttributeError. Calls to
one base_url share one concurrency limit (an asyncio.Semaphore per event loop and
endpoint). Sampling fields OpenAI does not define (top_k, min_p, repetition_penalty)
travel in `extra_body`, which vLLM and SGLang read.

A reply's body is capped (`max_response_bytes`, default 16 MiB): a server answering with
300 MB, or a body that never ends, fails the attempt once the cap is passed, before
the client holds more than the cap (the raw stream is counted as it arrives, a
Content-Length over the cap is refused before any of it is read, and bodies are asked
for uncompressed, so that a small compressed body cannot unpack past the cap).

Several servers of one model: `base_url` may be a list, and each attempt goes to the
endpoint with the fewest calls in flight (ties in turn), a retry to another one when it
can — the way to spread a large evaluation over machines (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
import sys
import weakref
from functools import cache
from typing import Any, AsyncIterator, Callable
from urllib.parse import urlsplit

from askspec.runtime.backends.base import (Backend, BackendError, ChatRequest, ChatResult, FinishReason, Sampling,
                                           SpecContext)
from askspec.runtime.backends.registry import AttemptTimedOut, RetriesExhausted, retry_async
from askspec.lang.paths import human_size
from askspec.runtime.backends.replay import json_kind
from askspec.terminal import printable

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # a chat reply is kilobytes; a few MB with long contexts

# One semaphore per (event loop, base_url): asyncio primitives belong to one loop, and the
# limit protects the endpoint whichever backend instance (model) calls it.
_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def endpoint_semaphore(base_url: str, limit: int) -> asyncio.Semaphore:
    """The shared semaphore for `base_url` on the running loop (the first limit given wins)."""
    per_loop = _semaphores.setdefault(asyncio.get_running_loop(), {})
    if base_url not in per_loop:
        per_loop[base_url] = asyncio.Semaphore(limit)
    return per_loop[base_url]


def chat_kwargs(sampling: Sampling) -> dict[str, Any]:
    """Map our Sampling onto chat.completions.create arguments (None fields are left out)."""
    kwargs = sampling.given()
    # not in the OpenAI API: servers that take them (vLLM, llama.cpp) read them from the body
    extra = {k: kwargs.pop(k) for k in ("top_k", "min_p", "repetition_penalty") if k in kwargs}
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


class MalformedReply(Exception):
    """HTTP 200, but the body is not a chat completion we can read (retried: a proxy's
    error page or a half-restarted server is usually gone on the next try)."""


class ReplyTooLarge(Exception):
    """The server's body passed ``max_response_bytes`` (retried: a stuck generation or a
    misrouted download may not happen again; each try reads at most the cap)."""


@cache
def _capped_stream(base: type) -> type:
    """A response body stream (a subclass of the client's own ``AsyncByteStream``, which
    it checks for) that fails with ReplyTooLarge past ``limit`` bytes."""

    class CappedStream(base):
        def __init__(self, inner: Any, limit: int) -> None:
            self.inner = inner
            self.limit = limit

        async def __aiter__(self) -> AsyncIterator[bytes]:
            seen = 0
            async for chunk in self.inner:
                seen += len(chunk)
                if seen > self.limit:
                    raise ReplyTooLarge(f"the body passed {human_size(self.limit)} and was cut off there "
                                        f"(max_response_bytes = {self.limit})")
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    return CappedStream


def _body_cap(http: Any, limit: int) -> Callable[[Any], Any]:
    """A response hook of the client's HTTP package ``http`` (httpx, or httpx2 in recent
    openai releases) that bounds the body about to be read (the client reads it whole,
    for an error status too)."""
    stream_type = _capped_stream(http.AsyncByteStream)

    async def cap(response: Any) -> None:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await response.aclose()
            raise ReplyTooLarge(f"the server announced a body of {human_size(int(declared))}, over "
                                f"{human_size(limit)} (max_response_bytes = {limit})")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            # asked for identity: a compressed body could unpack to any size past the cap
            raise MalformedReply(f"the body is compressed ({encoding}) though an uncompressed one was asked for")
        response.stream = stream_type(response.stream, limit)

    return cap


def parse_completion(body: bytes, content_type: str = "") -> tuple[str, FinishReason, int, int]:
    """(text, finish reason, prompt tokens, completion tokens) from a chat completion body;
    MalformedReply saying what is wrong when the body is not one."""
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser
        kind = content_type.split(";")[0].strip() or "no content-type"
        raise MalformedReply(f"the body is not JSON ({kind}, {len(body)} bytes): {_excerpt(body)}") from None
    if not isinstance(data, dict):
        raise MalformedReply(f"the body is {json_kind(data)}, not a chat completion object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        what = "has no 'choices'" if choices is None else (
            "has an empty 'choices' list" if isinstance(choices, list) else f"has 'choices' as {json_kind(choices)}"
        )
        error = data.get("error")  # some proxies send their errors with status 200
        if isinstance(error, dict):
            error = error.get("message", error)
        raise MalformedReply(f"the body {what}" + (f" (error: {_excerpt(str(error))})" if error else ""))
    choice = choices[0]
    if not isinstance(choice, dict):
        raise MalformedReply(f"choices[0] is {json_kind(choice)}, not an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedReply("choices[0] has no 'message' object" if message is None
                             else f"choices[0].message is {json_kind(message)}, not an object")
    content = message.get("content")
    if not isinstance(content, str):
        refusal = message.get("refusal")
        raise MalformedReply(f"choices[0].message.content is {json_kind(content)}, not a string"
                             + (f" (refusal: {_excerpt(refusal)})" if isinstance(refusal, str) else ""))
    reason = choice.get("finish_reason")
    usage = data.get("usage")
    return (content, _finish_reason(reason if isinstance(reason, str) else None),
            _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"))


def _count(usage: Any, key: str) -> int:
    """A token count from `usage`, 0 when the server sends none or nonsense (it is only
    bookkeeping; the reply itself is good)."""
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _excerpt(data: bytes | str, limit: int = 120) -> str:
    """The start of a server's text for an error message, on one line, escapes shown."""
    text = data[: limit * 4].decode("utf-8", "replace") if isinstance(data, bytes) else data
    cut = text[:limit]
    return repr(printable(cut, single_line=True) + ("..." if len(text) > limit else ""))


def _check_url(url: str, model: str) -> None:
    """BackendError unless `url` is an http(s) URL with a host (and a valid port)."""
    try:
        parts = urlsplit(url)
        parts.port  # parses the port: ValueError when it is not a number in range
    except ValueError as exc:
        raise BackendError(f"openai backend for {model!r}: base_url {url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BackendError(
            f"openai backend for {model!r}: base_url {url!r} must be an http:// or https:// URL with a host, "
            f"e.g. http://localhost:8000/v1"
        )


def _finish_reason(value: str | None) -> FinishReason:
    if value == "length":
        return "length"
    if value == "content_filter":
        return "error"  # the server withheld (part of) the reply
    return "stop"  # "stop", "tool_calls", "function_call", or a server that sends none


class OpenAIBackend(Backend):
    """Chat completions against an OpenAI-compatible server.

    Options:
      base_url         endpoint, e.g. "http://localhost:8000/v1" (default $OPENAI_BASE_URL,
                       else the OpenAI API), or a list of endpoints serving the same model
      api_key          the key itself (prefer api_key_env so specs hold no secrets)
      api_key_env      name of the env var holding the key (default OPENAI_API_KEY; a local
                       server needs none, so a missing default variable is allowed)
      timeout          seconds for one attempt as a whole, request sent to last byte read
                       (default 120); an attempt past it is cancelled and retried
      deadline         seconds for the whole call: every attempt and the backoff sleeps
                       between them (default 300); waiting for a max_concurrency slot
                       is not counted
      attempts         tries per call, first one included (default 5)
      base_delay       first backoff in seconds (default 0.5), doubled per retry
      max_delay        backoff cap in seconds (default 30)
      max_concurrency  calls in flight per base_url (default 32)
      extra_body       dict merged into every request body (server-specific fields)
      max_response_bytes  a reply's body at most (default 16 MiB); a longer one fails
                       the attempt (retried) with an error naming the limit
    """

    name = "openai"

    @classmethod
    def spec_options(cls, model: str, options: dict[str, Any], context: SpecContext) -> dict[str, Any]:
        """Spec names -> ours (`concurrency` -> max_concurrency, `retries` -> attempts), and
        the endpoint made explicit: --base-url, else the spec's `base_url`, else the run's
        default (a resumed run's recorded one), else $OPENAI_BASE_URL, else the OpenAI API."""
        out = {k: v for k, v in options.items() if k not in ("concurrency", "retries")}
        if "concurrency" in options:
            out["max_concurrency"] = options["concurrency"]
        if "retries" in options:
            out["attempts"] = int(options["retries"]) + 1
        out["base_url"] = (context.base_url or options.get("base_url") or context.default_base_url
                           or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL)
        return out

    def __init__(
        self,
        model: str,
        *,
        base_url: str | list[str] | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        timeout: float = 120.0,
        deadline: float = 300.0,
        attempts: int = 5,
        base_delay: float = 0.5,
        max_delay: float = 30.0,
        max_concurrency: int = 32,
        extra_body: dict[str, Any] | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - openai is a core dependency
            raise BackendError(f"the openai backend needs the 'openai' package: {exc}") from exc
        self._openai = openai
        self.model = model
        urls = base_url if isinstance(base_url, (list, tuple)) else [base_url]
        urls = [u for u in urls if u] or [os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL]
        if not all(isinstance(u, str) for u in urls):
            raise BackendError(f"openai backend for {model!r}: base_url must be a URL or a list of URLs")
        self.base_urls = list(dict.fromkeys(u.rstrip("/") for u in urls))
        self.base_url = ", ".join(self.base_urls)  # for messages
        self.endpoint = self.base_url
        self._in_flight = {u: 0 for u in self.base_urls}
        self._turn = 0
        if api_key is None:
            env_name = api_key_env or "OPENAI_API_KEY"
            api_key = os.environ.get(env_name)
            if api_key is None and api_key_env is not None:
                raise BackendError(
                    f"openai backend for {model!r}: environment variable {api_key_env} "
                    f"(named by api_key_env) is not set"
                )
        # Local servers (vllm serve, SGLang) accept any key, but the client insists on one.
        self.api_key = api_key or "EMPTY"
        if not (self.api_key.isascii() and self.api_key.isprintable()):  # never print the key itself
            raise BackendError(
                f"openai backend for {model!r}: the API key{f' in ${api_key_env}' if api_key_env else ''} has "
                f"characters an HTTP header cannot carry (non-ASCII or control characters)"
            )
        for url in self.base_urls:
            _check_url(url, model)
        if int(attempts) < 1 or int(max_concurrency) < 1:
            raise BackendError("openai backend: attempts and max_concurrency must be >= 1")
        for option, value in (("timeout", timeout), ("deadline", deadline)):
            if not (math.isfinite(float(value)) and float(value) > 0):
                raise BackendError(f"openai backend for {model!r}: {option} must be a positive number of seconds, got {value!r}")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int) or max_response_bytes < 1:
            raise BackendError(f"openai backend for {model!r}: max_response_bytes must be a positive number of bytes, "
                               f"got {max_response_bytes!r}")
        self.max_response_bytes = max_response_bytes
        self.timeout = float(timeout)
        self.deadline = float(deadline)
        self.attempts = int(attempts)
        self.base_delay = float(base_delay)
        self.max_delay = float(max_delay)
        self.max_concurrency = int(max_concurrency)
        self.extra_body = dict(extra_body or {})
        # httpx connection pools are bound to the loop that first used them.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = (
            weakref.WeakKeyDictionary()
        )

    def _client(self, base_url: str) -> Any:
        per_loop = self._clients.setdefault(asyncio.get_running_loop(), {})
        client = per_loop.get(base_url)
        if client is None:
            client_class = self._openai.DefaultAsyncHttpxClient  # the client's own defaults, plus the cap
            http_package = sys.modules[client_class.__mro__[1].__module__.partition(".")[0]]
            http = client_class(timeout=self.timeout, headers={"Accept-Encoding": "identity"},
                                event_hooks={"response": [_body_cap(http_package, self.max_response_bytes)]})
            client = per_loop[base_url] = self._openai.AsyncOpenAI(
                base_url=base_url,
                api_key=self.api_key,
                timeout=self.timeout,
                max_retries=0,  # we retry ourselves, with our own policy and limits
                http_client=http,
            )
        return client

    def _pick(self, avoid: str | None) -> str:
        """The endpoint with the fewest calls in flight, taking turns among equals; a retry
        avoids the endpoint that just failed when there is another."""
        urls = [u for u in self.base_urls if u != avoid] or self.base_urls
        self._turn += 1
        order = urls[self._turn % len(urls):] + urls[: self._turn % len(urls)]
        return min(order, key=lambda u: self._in_flight[u])

    def _retryable(self, exc: BaseException) -> bool:
        o = self._openai
        if isinstance(exc, (o.APITimeoutError, o.APIConnectionError, MalformedReply, ReplyTooLarge)):
            return True
        if isinstance(exc, o.APIStatusError):
            # 501/505: the server does not do this at all; asking again will not change that
            return exc.status_code in (408, 409, 429) or (500 <= exc.status_code < 600 and exc.status_code not in (501, 505))
        return False

    @staticmethod
    def _retry_after(exc: BaseException) -> float | None:
        response = getattr(exc, "response", None)
        value = response.headers.get("retry-after") if response is not None else None
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None  # an HTTP date; the backoff is good enough

    async def complete(self, request: ChatRequest) -> ChatResult:
        model = request.model or self.model
        kwargs = chat_kwargs(request.sampling)
        if self.extra_body:
            kwargs["extra_body"] = {**self.extra_body, **kwargs.get("extra_body", {})}
        messages = [dict(m) for m in request.messages]
        slot = _EndpointSlot(self)
        started = time.perf_counter()

        async def attempt() -> tuple[str, FinishReason, int, int]:
            client = self._client(slot.url)
            try:
                raw = await client.chat.completions.with_raw_response.create(model=model, messages=messages, **kwargs)
            except self._openai.APIConnectionError as exc:  # (the client wraps what the body cap raised)
                if isinstance(exc.__cause__, (ReplyTooLarge, MalformedReply)):
                    raise exc.__cause__ from None
                raise
            return parse_completion(raw.content, raw.headers.get("content-type", ""))

        def note_retry(n: int, exc: BaseException, delay: float) -> None:
            log.warning(
                "openai %s (%s): attempt %d/%d failed (%s); retrying in %.2fs",
                self.base_url, model, n, self.attempts, _describe(exc), delay,
            )

        try:
            text, finish, tokens_in, tokens_out = await retry_async(
                attempt,
                attempts=self.attempts,
                base_delay=self.base_delay,
                max_delay=self.max_delay,
                retry_on=self._retryable,
                delay_hint=self._retry_after,
                on_retry=note_retry,
                attempt_timeout=self.timeout,
                deadline=self.deadline,
                limit=slot,  # an endpoint's slot, held per attempt, not across backoff sleeps
            )
        except RetriesExhausted as exc:
            stopped = (f" and its deadline of {exc.deadline:g}s left no time for another"
                       if exc.deadline is not None else "")
            raise BackendError(
                f"openai endpoint {self.base_url} (model {model!r}) failed {exc.attempts} "
                f"time(s) in a row{stopped}; last error: {_describe(exc.last)}"
            ) from exc.last
        except self._openai.OpenAIError as exc:
            raise BackendError(
                f"openai endpoint {self.base_url} (model {model!r}) refused the request: {_describe(exc)}"
            ) from exc
        except Exception as exc:  # the client or httpx failing in a way of its own: still this call's failure
            raise BackendError(
                f"openai endpoint {self.base_url} (model {model!r}): the request failed: {type(exc).__name__}: {exc}"
            ) from exc
        latency = (time.perf_counter() - started) * 1000.0
        return ChatResult(text=text, finish_reason=finish, tokens_in=tokens_in, tokens_out=tokens_out,
                          latency_ms=latency)

    async def served_models(self) -> list[str]:
        """The model names the endpoint lists (GET /models); BackendError when it cannot."""
        try:
            page = await self._client(self.base_urls[0]).models.list()  # the servers of a list serve one model
        except self._openai.OpenAIError as exc:
            raise BackendError(f"openai endpoint {self.base_url}: cannot list its models: {_describe(exc)}") from exc
        return [m.id for m in getattr(page, "data", []) or [] if getattr(m, "id", None)]

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        for client in (self._clients.pop(loop, None) or {}).values():
            await client.close()
        # Clients of other (finished) loops cannot be closed from here; drop them.
        self._clients.clear()


class _EndpointSlot:
    """The `limit` of one call's attempts: entering picks the endpoint (OpenAIBackend._pick)
    and holds its concurrency slot; the attempt then talks to `url`. A failed attempt
    steers the next one elsewhere."""

    def __init__(self, backend: OpenAIBackend) -> None:
        self.backend = backend
        self.url = backend.base_urls[0]
        self.failed: str | None = None
        self._semaphore: asyncio.Semaphore | None = None

    async def __aenter__(self) -> "_EndpointSlot":
        b = self.backend
        self.url = b._pick(self.failed)
        self._semaphore = endpoint_semaphore(self.url, b.max_concurrency)
        b._in_flight[self.url] += 1
        try:
            await self._semaphore.acquire()
        except BaseException:
            b._in_flight[self.url] -= 1
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        assert self._semaphore is not None  # __aenter__ acquired it
        self._semaphore.release()
        self.backend._in_flight[self.url] -= 1
        self.failed = self.url if exc_type is not None else None
        return False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, MalformedReply):
        return f"malformed reply (HTTP 200): {exc}"
    if isinstance(exc, ReplyTooLarge):
        return f"reply too large: {exc}"
    if isinstance(exc, AttemptTimedOut):
        return f"timed out: {exc}"
    status = getattr(exc, "status_code", None)
    text = str(exc) or type(exc).__name__
    if status is not None:
        return f"HTTP {status}: {text}"
    cause = exc.__cause__  # the client's "Connection error." hides what httpx saw
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text} ({type(cause).__name__}: {cause})"
    return f"{type(exc).__name__}: {text}"
