"""A role answered by a Python callable, named in the spec as "package.module:function".

Opt-in only: a spec has to name the callable. It receives `(messages, request)` — the
messages as a list of plain dicts and the full `ChatRequest` — and returns the reply as a
str, a `ChatResult` (to report its own token counts or finish reason), or an awaitable of
either. Use it for symbolic solvers, dataset samplers and scripted opponents.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import time
from typing import Any, Callable

from askspec.runtime.backends.base import Backend, BackendError, ChatRequest, ChatResult


def load_callable(target: str) -> Callable[..., Any]:
    """Import "package.module:attr.path" and return the callable it names."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise BackendError(
            f"python backend: {target!r} is not of the form 'package.module:function'"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises at import
        raise BackendError(
            f"python backend: cannot import module {module_name!r} for {target!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BackendError(
                f"python backend: {module_name!r} has no attribute {attr_path!r} (wanted by {target!r})"
            ) from None
    if not callable(obj):
        raise BackendError(f"python backend: {target!r} is a {type(obj).__name__}, not a callable")
    return obj


class PythonBackend(Backend):
    """Calls `model` ("package.module:function") once per request.

    Options:
      threaded   run a synchronous callable in a worker thread so a slow one does not
                 stall other sessions (default False: called inline, which is cheapest)
    """

    name = "python"

    def __init__(self, model: str, *, threaded: bool = False) -> None:
        self.target = model
        self.threaded = bool(threaded)
        self.fn = load_callable(model)

    async def complete(self, request: ChatRequest) -> ChatResult:
        started = time.perf_counter()
        messages = [dict(m) for m in request.messages]
        try:
            if self.threaded and not inspect.iscoroutinefunction(self.fn):
                out = await asyncio.to_thread(self.fn, messages, request)
            else:
                out = self.fn(messages, request)
            if inspect.isawaitable(out):
                out = await out
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(
                f"python backend {self.target!r} raised {type(exc).__name__}: {exc} "
                f"(role {request.role!r}, session {request.session_index}, call {request.call_index + 1})"
            ) from exc
        latency = (time.perf_counter() - started) * 1000.0
        if isinstance(out, ChatResult):
            return out
        if not isinstance(out, str):
            raise BackendError(
                f"python backend {self.target!r} returned {type(out).__name__}; "
                f"it must return a str or a ChatResult"
            )
        return ChatResult(text=out, finish_reason="stop", latency_ms=latency)
