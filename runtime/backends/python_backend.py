"""A role answered by a Python callable, named in the spec as "package.module:function".

Opt-in only: a spec has to name the callable. It receives `(messages, request)` — the
messages as a list of plain dicts and the full `ChatRequest` — and returns the reply as a
str, a `ChatResult` (to report its own token counts or finish reason), or an awaitable of
either. Use it for symbolic solvers, dataset samplers and scripted opponents.

A synchronous callable never runs on the event loop: it runs on a worker thread, so a
slow one neither stalls other sessions nor keeps Ctrl-C (which the loop handles) from
stopping the run, and a call past `timeout` is given up on. Python cannot stop a thread,
so a call given up on keeps running on its thread until it returns, and its reply is
dropped; the threads are daemon threads so that such a call never holds up the exit of
the process (an executor's threads would: interpreter exit and asyncio.run join them).
An async callable runs on the loop and is cancelled at the deadline (one that blocks
without awaiting cannot be interrupted; use a synchronous callable for such work). An
instant model (a scripted opponent, a sampler) is cheapest as an async callable: no
thread hop, and no deadline timer unless it actually awaits something
(docs/benchmarks.md, "Cheap yields").
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import os
import threading
import time
from collections import deque
from typing import Any, Callable

from askspec.runtime.backends.base import Backend, BackendError, ChatRequest, ChatResult
from askspec.runtime.backends.loop import let_loop_run, loop_due


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
      timeout    seconds one call may run (default 120), counted from when it starts
                 (a call waiting its turn behind others of the same callable is not
                 running); past it the call fails with a BackendError and is abandoned
      threaded   let calls of a synchronous callable overlap on several worker threads
                 (it must then be thread-safe); by default they run one at a time on one
                 worker thread, in the order they were made, as an inline call would
    """

    name = "python"

    def __init__(self, model: str, *, timeout: float = 120.0, threaded: bool = False) -> None:
        self.target = model
        try:
            self.timeout = float(timeout)
        except (TypeError, ValueError):
            self.timeout = math.nan
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise BackendError(f"python backend {model!r}: timeout must be a positive number of seconds, got {timeout!r}")
        self.threaded = bool(threaded)
        self.fn = load_callable(model)
        self._is_async = inspect.iscoroutinefunction(self.fn)
        self._workers = _Workers(min(32, (os.cpu_count() or 1) + 4) if self.threaded else 1, model)

    def determinism(self, concurrency: int) -> dict[str, Any]:
        return {"level": "callable", "why": "the callable is sent the same requests (messages, seed, session and call "
                                            "number) at any concurrency; one that depends on nothing else, not on the "
                                            "order of its calls, gives the same replies"}

    async def complete(self, request: ChatRequest) -> ChatResult:
        started = time.perf_counter()
        try:  # the callable's own copies (dict.copy: a third cheaper than dict(); a message that is
            messages = list(map(dict.copy, request.messages))  # no dict is copied as before)
        except TypeError:
            messages = list(map(dict, request.messages))
        scope = None  # the asyncio.timeout of the await on the loop, when there is one
        try:
            if self._is_async:
                # one that never awaits would otherwise never let the loop run (Ctrl-C)
                if loop_due():
                    await let_loop_run()
                coro = self.fn(messages, request)
                try:  # its first step: an instant callable ends here, and needs no deadline timer
                    waiting_on = coro.send(None)
                except StopIteration as done:
                    out = done.value
                else:
                    async with asyncio.timeout(self.timeout) as scope:
                        out = await _Resumed(coro, waiting_on)
            else:
                out, ran_from = await self._workers.call(self.fn, (messages, request), self.timeout)
                if inspect.isawaitable(out):  # a plain function returning a coroutine
                    left = self.timeout - (time.monotonic() - ran_from)
                    async with asyncio.timeout(max(left, 0.0)) as scope:
                        out = await out
        except BackendError:
            raise
        except _GaveUp:
            raise self._timed_out(request) from None
        except TimeoutError as exc:
            if scope is not None and scope.expired():  # our deadline, not the callable's own TimeoutError
                raise self._timed_out(request) from None
            raise self._raised(exc, request) from exc
        except Exception as exc:
            raise self._raised(exc, request) from exc
        latency = (time.perf_counter() - started) * 1000.0
        if isinstance(out, ChatResult):
            self._check_result(out)
            return out
        if not isinstance(out, str):
            raise BackendError(
                f"python backend {self.target!r} returned {type(out).__name__}; "
                f"it must return a str or a ChatResult"
            )
        return ChatResult(text=out, finish_reason="stop", latency_ms=latency)

    def _check_result(self, out: ChatResult) -> None:
        """A ChatResult is built by user code: a wrong field would fail later, in the
        engine, as an internal error; refuse it here, naming the callable."""
        counts = (out.tokens_in, out.tokens_out)
        problem = (
            f"text is {type(out.text).__name__}, not str" if not isinstance(out.text, str)
            else f"finish_reason {out.finish_reason!r} is not 'stop', 'length' or 'error'"
            if out.finish_reason not in ("stop", "length", "error")
            else "tokens_in and tokens_out must be ints >= 0"
            if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts)
            else "latency_ms must be a number" if not isinstance(out.latency_ms, (int, float))
            else "ttft_ms must be a number or None"
            if out.ttft_ms is not None and (isinstance(out.ttft_ms, bool) or not isinstance(out.ttft_ms, (int, float)))
            else None
        )
        if problem:
            raise BackendError(f"python backend {self.target!r} returned a ChatResult whose {problem}")

    def _where(self, request: ChatRequest) -> str:
        return f"role {request.role!r}, session {request.session_index}, call {request.call_index + 1}"

    def _raised(self, exc: BaseException, request: ChatRequest) -> BackendError:
        return BackendError(
            f"python backend {self.target!r} raised {type(exc).__name__}: {exc} ({self._where(request)})"
        )

    def _timed_out(self, request: ChatRequest) -> BackendError:
        return BackendError(
            f"python backend {self.target!r} gave no reply within its timeout of {self.timeout:g}s "
            f"({self._where(request)}); the call was abandoned"
        )

    async def aclose(self) -> None:
        self._workers.close()


class _Resumed:
    """Awaits a coroutine from where its first step suspended (on `waiting_on`): what
    `await coro` would have done from there, sends, throws and cancellation included.
    Stepping an async callable once before arming its deadline spares an instant one
    the timer (~5 us a call, a tenth of the engine's own cost per call)."""

    __slots__ = ("coro", "waiting_on")

    def __init__(self, coro: Any, waiting_on: Any) -> None:
        self.coro, self.waiting_on = coro, waiting_on

    def __await__(self):
        coro, pending = self.coro, self.waiting_on
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation (the deadline's too) goes in
                try:
                    pending = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as done:
                    return done.value


# ---------------------------------------------------------------------------------------
# Worker threads.

_QUEUED, _RUNNING, _DONE = 0, 1, 2


class _GaveUp(Exception):
    """A job ran past its timeout (set on its future by the watchdog)."""


class _Job:
    __slots__ = ("fn", "args", "loop", "future", "timeout", "state", "thread", "started")

    def __init__(self, fn: Callable[..., Any], args: tuple, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.fn, self.args, self.loop, self.timeout = fn, args, loop, timeout
        self.future: asyncio.Future = loop.create_future()
        self.state = _QUEUED
        self.thread: _Thread | None = None
        self.started = 0.0  # time.monotonic() when a thread picked it up


class _Thread(threading.Thread):
    def __init__(self, workers: "_Workers") -> None:
        super().__init__(name=f"askspec-python:{workers.name}", daemon=True)
        self.workers = workers
        self.retired = False  # given up on while running a job: exit once it returns

    def run(self) -> None:
        self.workers.serve(self)


class _Workers:
    """At most `size` daemon threads taking jobs from one queue, in order.

    A job that overruns its timeout retires its thread (which exits when the job finally
    returns) and a fresh thread takes the rest of the queue, so one stuck call does not
    stall every later one. An instant callable is the common case (scripted opponents,
    samplers) and the thread hop is pure overhead there, so the hop is batched both ways:
    the jobs made in one turn of the loop are queued together (one wake-up of the
    threads), results are handed back in batches (one wake-up of the loop), and there is
    one watchdog timer per loop rather than one per job.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self.name = name
        self._cv = threading.Condition(threading.Lock())
        self._jobs: deque[_Job] = deque()
        self._running: set[_Job] = set()
        self._live = 0  # threads not retired
        self._idle = 0  # threads waiting for a job and not yet woken
        self._closed = False
        # per event loop (one in practice): results on their way back, and the watchdog
        self._results: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any, BaseException | None]]] = {}
        self._outbox: dict[asyncio.AbstractEventLoop, list[_Job]] = {}  # made this turn of the loop, not yet queued
        self._watchdogs: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}

    async def call(self, fn: Callable[..., Any], args: tuple, timeout: float) -> tuple[Any, float]:
        """fn(*args) on a worker thread: (its result, time.monotonic() when it started).

        Raises _GaveUp once it has run for `timeout` (waiting in the queue not counted);
        a caller that is cancelled or gives up abandons the job."""
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, loop, timeout)
        outbox = self._outbox.get(loop)
        if outbox is None:  # the first job of this turn of the loop: hand them over after it
            outbox = self._outbox[loop] = []
            loop.call_soon(self._hand_over, loop)
        outbox.append(job)
        if loop not in self._watchdogs:
            self._arm(loop, timeout)
        try:
            result = await job.future
            return result, job.started
        finally:
            if not job.future.done() or job.future.cancelled() or isinstance(job.future.exception(), _GaveUp):
                self._abandon(job)

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        """Queue the jobs made during one turn of the loop, waking threads once for all."""
        batch = self._outbox.pop(loop, [])
        with self._cv:
            self._closed = False  # a backend reused after aclose (a later run in-process)
            self._jobs.extend(batch)
            wanted = len(batch)
            while wanted and self._idle:
                self._idle -= 1
                wanted -= 1
                self._cv.notify()
            while wanted and self._live < self._size:
                self._spawn()
                wanted -= 1

    def close(self) -> None:
        """Let idle threads exit (busy ones exit after their job)."""
        with self._cv:
            self._closed = True
            self._idle = 0
            self._cv.notify_all()

    def _arm(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        for old in [lp for lp in self._watchdogs if lp.is_closed()]:
            del self._watchdogs[old]
        self._watchdogs[loop] = loop.call_later(delay, self._watch, loop)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail the loop's jobs that have run past their timeout; come back when the next
        running one would, or (jobs only queued) one timeout from now, which a job starting
        meanwhile cannot have outlived."""
        del self._watchdogs[loop]
        now = time.monotonic()
        expired: list[_Job] = []
        wake: float | None = None
        with self._cv:
            for job in self._running:
                if job.loop is loop:
                    end = job.started + job.timeout
                    if end <= now:
                        expired.append(job)
                    else:
                        wake = end - now if wake is None else min(wake, end - now)
            if wake is None:
                # queued, or made this turn and not yet queued (this tick may run before that)
                first = next((j for j in self._jobs if j.loop is loop and j.state == _QUEUED), None) or next(
                    iter(self._outbox.get(loop, ())), None)
                wake = first.timeout if first is not None else None
        for job in expired:
            if not job.future.done():
                job.future.set_exception(_GaveUp())
        if wake is not None:
            self._arm(loop, wake)

    def _abandon(self, job: _Job) -> None:
        with self._cv:
            if job.state == _QUEUED:
                job.state = _DONE  # a thread that pops it skips it
            elif job.state == _RUNNING and job.thread is not None and not job.thread.retired:
                job.thread.retired = True
                self._running.discard(job)
                self._live -= 1
                if self._jobs and not self._idle:
                    self._spawn()

    def _spawn(self) -> None:  # with self._cv held
        self._live += 1
        _Thread(self).start()

    def serve(self, me: _Thread) -> None:
        """The body of each worker thread."""
        while True:
            with self._cv:
                while True:
                    while not self._jobs:
                        if self._closed:
                            self._live -= 1
                            return
                        self._idle += 1
                        self._cv.wait()
                    job = self._jobs.popleft()
                    if job.state == _QUEUED:
                        break  # else abandoned while it waited
                job.state, job.thread, job.started = _RUNNING, me, time.monotonic()
                self._running.add(job)
            try:
                result, error = job.fn(*job.args), None
            except BaseException as exc:  # handed to the caller as is (SystemExit included)
                result, error = None, exc
            with self._cv:
                self._running.discard(job)
                job.state, job.thread = _DONE, None
                retired = me.retired
                # One wake-up of the loop (a write to its self-pipe) per batch of results,
                # not per result: until the loop runs the drain scheduled before, later
                # results join that batch.
                pending = self._results.get(job.loop)
                wake = pending is None
                if pending is None:
                    pending = self._results[job.loop] = []
                pending.append((job.future, result, error))
            if wake:
                try:
                    job.loop.call_soon_threadsafe(self._drain, job.loop)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    with self._cv:
                        self._results.pop(job.loop, None)
            del job, result, error, pending
            if retired:
                return

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._cv:
            batch = self._results.pop(loop, ())
        for future, result, error in batch:
            if future.done():  # given up on, or its caller was cancelled
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
