"""Python backend: "module:function" callables, sync and async, with clear errors; calls
that are bounded by `timeout` and never block the event loop."""

from __future__ import annotations

import asyncio
import textwrap
import threading

import pytest

from askspec.runtime.backends.base import BackendError, ChatRequest, ChatResult
from askspec.runtime.backends.python_backend import PythonBackend

MODULE = textwrap.dedent(
    '''
    import asyncio
    from askspec.runtime.backends.base import ChatResult

    NOT_CALLABLE = 42

    def echo(messages, request):
        return f"{request.role}:{messages[-1]['content']}"

    async def async_echo(messages, request):
        await asyncio.sleep(0)
        return messages[-1]["content"].upper()

    async def instant_async(messages, request):
        return "at once"

    def full(messages, request):
        return ChatResult(text="x", finish_reason="length", tokens_in=3, tokens_out=1)

    def boom(messages, request):
        raise ValueError("no solution")

    def wrong_type(messages, request):
        return 7

    class Solver:
        @staticmethod
        def solve(messages, request):
            return "solved"

    # -- for the bounds: the test sets RELEASE when it is done, so no thread outlives it
    import threading, time
    RELEASE = threading.Event()
    ACTIVE = []
    PEAK = []
    STARTED = threading.Event()

    def stuck(messages, request):
        STARTED.set()
        RELEASE.wait(20)
        return "released" if RELEASE.is_set() else "gave up waiting"

    def busy(messages, request):
        ACTIVE.append(1)
        PEAK.append(len(ACTIVE))
        time.sleep(0.05)
        ACTIVE.pop()
        return messages[-1]["content"]

    def stuck_once(messages, request):
        if messages[-1]["content"] == "stick":
            RELEASE.wait(20)
        return "ok " + messages[-1]["content"]

    def returns_coroutine(messages, request):
        return async_echo(messages, request)

    def own_timeout(messages, request):
        raise TimeoutError("the solver's own limit")

    CANCELLED = []

    async def async_stuck(messages, request):
        try:
            await asyncio.sleep(20)
        except asyncio.CancelledError:
            CANCELLED.append(request.call_index)
            raise
        return "late"

    def barrier(messages, request):
        BARRIER.wait()
        return "met"

    BARRIER = threading.Barrier(2, timeout=10)

    async def many_awaits(messages, request):
        loop = asyncio.get_running_loop()
        got = []
        for k in range(3):
            fut = loop.create_future()
            loop.call_later(0.01, fut.set_result, k)
            got.append(await fut)  # the value sent back in after each suspension
        try:
            await asyncio.sleep(0.01)
            raise LookupError("after suspending")
        except LookupError as e:
            return f"{got} {e}"

    async def raises_late(messages, request):
        await asyncio.sleep(0.01)
        raise KeyError("late")
    '''
)


@pytest.fixture
def module(tmp_path, monkeypatch):
    (tmp_path / "askspec_test_callables.py").write_text(MODULE)
    (tmp_path / "askspec_test_broken.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "askspec_test_callables"


def _req(text: str = "hello") -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": text},), role="solver", call_index=2)


async def test_sync_callable(module):
    result = await PythonBackend(f"{module}:echo").complete(_req())
    assert result.text == "solver:hello"
    assert result.finish_reason == "stop"


async def test_sync_callable_threaded(module):
    result = await PythonBackend(f"{module}:echo", threaded=True).complete(_req("t"))
    assert result.text == "solver:t"


async def test_async_callable(module):
    assert (await PythonBackend(f"{module}:async_echo").complete(_req())).text == "HELLO"


async def test_dotted_attribute_and_chat_result_passthrough(module):
    assert (await PythonBackend(f"{module}:Solver.solve").complete(_req())).text == "solved"
    result = await PythonBackend(f"{module}:full").complete(_req())
    assert result == ChatResult(text="x", finish_reason="length", tokens_in=3, tokens_out=1)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("no_colon_here", "is not of the form 'package.module:function'"),
        ("askspec_test_missing_mod:f", "cannot import module 'askspec_test_missing_mod'"),
        ("askspec_test_broken:f", "RuntimeError: broken at import"),
        ("askspec_test_callables:nope", "has no attribute 'nope'"),
        ("askspec_test_callables:NOT_CALLABLE", "is a int, not a callable"),
    ],
)
def test_load_errors(module, target, expected):
    with pytest.raises(BackendError) as info:
        PythonBackend(target)
    assert expected in str(info.value)


async def test_callable_exception_becomes_backend_error(module):
    with pytest.raises(BackendError) as info:
        await PythonBackend(f"{module}:boom").complete(_req())
    message = str(info.value)
    assert "raised ValueError: no solution" in message
    assert "role 'solver'" in message and "call 3" in message
    assert isinstance(info.value.__cause__, ValueError)


async def test_wrong_return_type(module):
    with pytest.raises(BackendError, match="returned int; it must return a str or a ChatResult"):
        await PythonBackend(f"{module}:wrong_type").complete(_req())


# -- bounds and the event loop ----------------------------------------------------------------


@pytest.fixture
def callables(module):
    import importlib

    mod = importlib.import_module(module)  # imported once per test session: reset its state
    mod.RELEASE.clear()
    mod.CANCELLED.clear()
    mod.PEAK.clear()
    yield mod
    mod.RELEASE.set()  # let any abandoned call finish


async def test_sync_callable_does_not_block_the_loop(callables, module):
    # the loop must keep running while a synchronous call waits: it releases the call
    task = asyncio.ensure_future(PythonBackend(f"{module}:stuck").complete(_req()))
    await asyncio.sleep(0.05)
    callables.RELEASE.set()
    assert (await asyncio.wait_for(task, 10)).text == "released"


async def test_timeout_bounds_a_sync_callable(callables, module):
    from askspec.runtime.backends.registry import make_backend

    backend = make_backend("python", f"{module}:stuck", {"timeout": 0.3})  # the spec's option reaches it
    with pytest.raises(BackendError) as info:
        await asyncio.wait_for(backend.complete(_req()), 10)
    assert str(info.value) == (
        f"python backend '{module}:stuck' gave no reply within its timeout of 0.3s "
        "(role 'solver', session 0, call 3); the call was abandoned"
    )


async def test_timeout_cancels_an_async_callable(callables, module):
    backend = PythonBackend(f"{module}:async_stuck", timeout=0.2)
    with pytest.raises(BackendError, match="gave no reply within its timeout of 0.2s"):
        await asyncio.wait_for(backend.complete(_req()), 10)
    assert callables.CANCELLED == [2]


async def test_a_callables_own_timeout_error_is_its_error(callables, module):
    with pytest.raises(BackendError, match="raised TimeoutError: the solver's own limit"):
        await PythonBackend(f"{module}:own_timeout").complete(_req())


async def test_a_plain_function_returning_a_coroutine(callables, module):
    assert (await PythonBackend(f"{module}:returns_coroutine").complete(_req("up"))).text == "UP"


async def test_a_stuck_call_does_not_stall_later_ones(callables, module):
    backend = PythonBackend(f"{module}:stuck_once", timeout=0.3)
    first = asyncio.ensure_future(backend.complete(_req("stick")))
    later = asyncio.ensure_future(backend.complete(_req("next")))  # queued behind it
    with pytest.raises(BackendError, match="timeout of 0.3s"):
        await asyncio.wait_for(first, 10)
    assert (await asyncio.wait_for(later, 10)).text == "ok next"


async def test_calls_run_one_at_a_time_and_queueing_is_not_running(callables, module):
    # 8 calls of 0.05 s queue for up to 0.35 s, past the 0.2 s timeout, and all succeed:
    # the timeout counts from when a call starts
    backend = PythonBackend(f"{module}:busy", timeout=0.2)
    results = await asyncio.gather(*(backend.complete(_req(f"m{i}")) for i in range(8)))
    assert [r.text for r in results] == [f"m{i}" for i in range(8)]
    assert max(callables.PEAK) == 1


async def test_threaded_calls_overlap(callables, module):
    backend = PythonBackend(f"{module}:barrier", threaded=True)
    results = await asyncio.wait_for(asyncio.gather(*(backend.complete(_req()) for _ in range(2))), 15)
    assert [r.text for r in results] == ["met", "met"]


async def test_cancelling_a_call_returns_at_once_and_the_backend_goes_on(callables, module):
    backend = PythonBackend(f"{module}:stuck_once")
    task = asyncio.ensure_future(backend.complete(_req("stick")))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert (await asyncio.wait_for(backend.complete(_req("after")), 5)).text == "ok after"


@pytest.mark.parametrize("value", [0, -2, float("nan"), float("inf"), "soon"])
def test_timeout_must_be_positive_and_finite(module, value):
    with pytest.raises(BackendError, match="timeout must be a positive number of seconds"):
        PythonBackend(f"{module}:echo", timeout=value)


def test_the_backend_works_across_event_loops(callables, module):
    # one shared instance serves successive runs (each asyncio.run is a new loop)
    backend = PythonBackend(f"{module}:echo")
    for text in ("one", "two"):
        assert asyncio.run(backend.complete(_req(text))).text == f"solver:{text}"


def test_no_worker_thread_is_left_blocking_exit(callables, module):
    backend = PythonBackend(f"{module}:stuck", timeout=0.1)
    with pytest.raises(BackendError):
        asyncio.run(backend.complete(_req()))
    # the abandoned call still runs, on a daemon thread: interpreter exit will not wait for it
    stuck = [t for t in threading.enumerate() if t.name == f"askspec-python:{module}:stuck"]
    assert stuck and all(t.daemon for t in stuck)


@pytest.fixture
def holder(tmp_path, monkeypatch):
    """A callable returning whatever the test puts in RESULT."""
    import importlib

    (tmp_path / "askspec_test_results_holder.py").write_text("RESULT = None\n\ndef give(messages, request):\n    return RESULT\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module("askspec_test_results_holder")


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (ChatResult(text=None), "text is NoneType, not str"),  # type: ignore[arg-type]
        (ChatResult(text="x", finish_reason="done"), "finish_reason 'done' is not 'stop', 'length' or 'error'"),  # type: ignore[arg-type]
        (ChatResult(text="x", tokens_out=-1), "tokens_in and tokens_out must be ints >= 0"),
        (ChatResult(text="x", tokens_in="3"), "tokens_in and tokens_out must be ints >= 0"),  # type: ignore[arg-type]
    ],
)
async def test_a_malformed_chat_result_is_refused(holder, result, expected):
    holder.RESULT = result
    with pytest.raises(BackendError) as info:
        await PythonBackend("askspec_test_results_holder:give").complete(_req())
    assert str(info.value) == f"python backend 'askspec_test_results_holder:give' returned a ChatResult whose {expected}"


async def test_a_session_of_instant_async_calls_can_be_cancelled(module):
    # an async callable that never awaits finishes without suspending: without a yield per
    # call a session of such calls would run to its end in one step, deaf to Ctrl-C
    backend = PythonBackend(f"{module}:instant_async")
    answered = 0

    async def session() -> None:
        nonlocal answered
        for _ in range(100_000):
            await backend.complete(_req())
            answered += 1

    task = asyncio.ensure_future(session())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert answered < 100_000


async def test_the_watchdog_keeps_watching_a_job_made_in_its_own_turn():
    # the watchdog's tick can run in the same turn of the loop as a call that found it
    # armed, before that call's job is queued; it must not stand down then
    from askspec.runtime.backends.python_backend import _Job, _Workers

    loop = asyncio.get_running_loop()
    workers = _Workers(1, "t")
    workers._arm(loop, 100)
    workers._watchdogs[loop].cancel()
    workers._outbox[loop] = [_Job(print, (), loop, 0.5)]
    workers._watch(loop)
    assert loop in workers._watchdogs
    workers._watchdogs.pop(loop).cancel()


async def test_an_async_callable_resumed_after_its_first_step(module):
    """An async callable is stepped once before its deadline is armed (an instant one
    needs no timer); one that suspends is awaited from there as `await` would: the
    values its awaits get, its own exceptions, the deadline and cancellation."""
    backend = PythonBackend(f"{module}:many_awaits", timeout=5)
    assert (await backend.complete(_req())).text == "[0, 1, 2] after suspending"
    assert (await PythonBackend(f"{module}:instant_async").complete(_req())).text == "at once"
    with pytest.raises(BackendError, match="raised KeyError: 'late'"):
        await PythonBackend(f"{module}:raises_late").complete(_req())
    import askspec_test_callables as m

    stuck = PythonBackend(f"{module}:async_stuck", timeout=30)
    task = asyncio.ensure_future(stuck.complete(_req()))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert m.CANCELLED == [2]  # the cancellation reached the callable
