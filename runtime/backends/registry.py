"""Make backends by kind, sharing one instance per (kind, model, options); a spec model's
options are translated by its backend class (`spec_options`); plus retry_async.

Backend modules are imported on first use, so naming the replay or python backend never
pulls in torch, and the vllm extra is only needed by specs that ask for it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import random
import threading
from contextlib import AbstractAsyncContextManager
from typing import Any, Awaitable, Callable, TypeVar

from askspec.runtime.backends.base import Backend, BackendError, SpecContext

log = logging.getLogger(__name__)

T = TypeVar("T")

# kind (askspec.ir.vocab.BACKENDS) -> (module in this package, class name)
BACKENDS: dict[str, tuple[str, str]] = {
    "hf": ("hf", "HFBackend"),
    "openai": ("openai_backend", "OpenAIBackend"),
    "vllm": ("vllm_backend", "VLLMBackend"),
    "python": ("python_backend", "PythonBackend"),
    "replay": ("replay", "ReplayBackend"),
}

_instances: dict[tuple[str, str, str], Backend] = {}
_lock = threading.Lock()


def backend_class(kind: str) -> type[Backend]:
    """The class for `kind`; BackendError listing the valid kinds when there is none."""
    if kind not in BACKENDS:
        valid = ", ".join(repr(k) for k in BACKENDS)
        raise BackendError(f"unknown backend {kind!r}; valid backends are {valid}")
    module_name, class_name = BACKENDS[kind]
    module = importlib.import_module(f"{__package__}.{module_name}")
    return getattr(module, class_name)


def backend_options(kind: str) -> tuple[str, ...]:
    """Option names the `kind` backend accepts (its constructor's keyword-only arguments)."""
    params = inspect.signature(backend_class(kind).__init__).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def make_backend(kind: str, model: str, options: dict[str, Any] | None = None) -> Backend:
    """Return the shared backend for (kind, model, the options that backend accepts).

    Options the backend does not take (e.g. sampling fields that travel in the same spec
    block) are ignored here; the spec checker is where unknown names are reported.
    """
    # a concrete backend's constructor: (model, **its keyword-only options); abstract Backend declares none
    cls: Callable[..., Backend] = backend_class(kind)
    accepted = set(backend_options(kind))
    relevant = {k: v for k, v in (options or {}).items() if k in accepted}
    key = (kind, model, json.dumps(relevant, sort_keys=True, default=repr))
    with _lock:
        backend = _instances.get(key)
        if backend is None:
            try:
                backend = cls(model, **relevant)
            except BackendError:
                raise
            except (TypeError, ValueError) as exc:
                raise BackendError(f"{kind} backend for {model!r}: bad options {relevant}: {exc}") from exc
            _instances[key] = backend
        return backend


def backend_for_spec(kind: str, model: str, spec_options: dict[str, Any], context: SpecContext) -> Backend:
    """The shared backend for a spec's model: its options translated by the backend's own
    `spec_options` (each backend knows its option names), then `make_backend`."""
    return make_backend(kind, model, backend_class(kind).spec_options(model, dict(spec_options), context))


async def aclose_backends() -> None:
    """Close and forget every shared backend (end of a run, or between tests)."""
    with _lock:
        backends = list(_instances.values())
        _instances.clear()
    for backend in backends:
        try:
            await backend.aclose()
        except Exception:  # closing is best effort; one failure must not hide the rest
            log.exception("closing backend %s failed", backend.name)


# ---------------------------------------------------------------------------------------
# Retries.
#
# Which errors are transient is the caller's call (`retry_on`): a 5xx or a dropped
# connection is, a 400 is not; an attempt that outlived `attempt_timeout`
# (AttemptTimedOut) always is. A call is
# bounded as a whole: `attempt_timeout` caps each attempt from its first byte sent to its
# last byte read (not per read: a server dripping a byte at a time is cut off), and
# `deadline` caps the attempts and the backoff sleeps between them together.


class AttemptTimedOut(Exception):
    """One attempt ran past its time limit; retry_async cancelled it (and retries)."""

    def __init__(self, seconds: float, *, by_deadline: bool = False) -> None:
        why = " (what was left of the call's deadline)" if by_deadline else ""
        super().__init__(f"no complete reply within {seconds:.3g}s{why}")
        self.seconds = seconds


class RetriesExhausted(Exception):
    """Every attempt failed with a retryable error, or the deadline left no time for
    another; `last` is the final error, `deadline` the deadline that stopped the retries
    (None when the attempts ran out)."""

    def __init__(self, attempts: int, last: BaseException, *, deadline: float | None = None) -> None:
        why = f" (the call's deadline of {deadline:.3g}s was reached)" if deadline is not None else ""
        super().__init__(f"gave up after {attempts} attempt(s){why}: {type(last).__name__}: {last}")
        self.attempts = attempts
        self.last = last
        self.deadline = deadline


def backoff_delay(attempt: int, base_delay: float, max_delay: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with "equal jitter": half fixed, half random, capped at max_delay.

    `attempt` is the number of failures so far (1 for the first retry).
    """
    cap = min(max_delay, base_delay * (2 ** (attempt - 1)))
    draw = (rng or random).random()
    return cap / 2 + draw * cap / 2


async def retry_async(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    base_delay: float,
    max_delay: float,
    retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool],
    delay_hint: Callable[[BaseException], float | None] | None = None,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    attempt_timeout: float | None = None,
    deadline: float | None = None,
    limit: AbstractAsyncContextManager[Any] | None = None,
) -> T:
    """Call `fn()` up to `attempts` times, sleeping with jittered backoff between tries.

    `retry_on` is a tuple of exception types or a predicate; any other exception propagates
    at once. `delay_hint(exc)` may return a server-suggested wait (e.g. Retry-After), used
    when longer than the backoff but still capped at max_delay. When every attempt fails,
    RetriesExhausted is raised from the last error.

    `attempt_timeout` (seconds) bounds each attempt as a whole; one that runs longer is
    cancelled and retried (AttemptTimedOut). `deadline` (seconds) bounds the attempts
    plus the sleeps between them: an attempt gets at most what is left of it, and no
    retry is started when its backoff would reach it. `limit` (a semaphore, e.g. an
    endpoint's concurrency limit) is held during each attempt, not across sleeps; time
    spent waiting for it counts against neither bound, since it is local queueing, not
    the far side's doing.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for name, value in (("attempt_timeout", attempt_timeout), ("deadline", deadline)):
        if value is not None and not value > 0:  # also refuses NaN
            raise ValueError(f"{name} must be > 0 seconds, got {value}")
    if isinstance(retry_on, type):  # one exception class: callable, but not a predicate
        retry_on = (retry_on,)
    if isinstance(retry_on, tuple):
        types = retry_on
        should_retry: Callable[[BaseException], bool] = lambda exc: isinstance(exc, types)
    else:
        should_retry = retry_on
    loop = asyncio.get_running_loop()
    spent = 0.0  # seconds of attempts and sleeps so far, queueing for `limit` excluded

    async def bounded() -> T:
        nonlocal spent
        left = None if deadline is None else deadline - spent
        budget = attempt_timeout if left is None or (attempt_timeout is not None and attempt_timeout <= left) else left
        started = loop.time()
        try:
            async with asyncio.timeout(budget) as scope:
                return await fn()
        except TimeoutError:
            if scope.expired():  # our limit, not a TimeoutError of fn's own
                assert budget is not None
                raise AttemptTimedOut(budget, by_deadline=budget != attempt_timeout) from None
            raise
        finally:
            spent += loop.time() - started

    for attempt in range(1, attempts + 1):
        try:
            if limit is None:
                return await bounded()
            async with limit:
                return await bounded()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, AttemptTimedOut) and not should_retry(exc):
                raise
            if attempt == attempts:
                raise RetriesExhausted(attempts, exc) from exc
            delay = backoff_delay(attempt, base_delay, max_delay)
            hint = delay_hint(exc) if delay_hint else None
            if hint is not None and hint > delay:
                delay = min(hint, max_delay)
            if deadline is not None and spent + delay >= deadline:
                raise RetriesExhausted(attempt, exc, deadline=deadline) from exc
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            await asyncio.sleep(delay)
            spent += delay
    raise AssertionError("unreachable")  # pragma: no cover
