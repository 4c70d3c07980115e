"""Backend factory (kinds, sharing, option filtering) and the retry helper."""

from __future__ import annotations

import json
import random

import pytest

from askspec.runtime.backends import registry
from askspec.runtime.backends.base import BackendError
from askspec.runtime.backends.registry import (
    AttemptTimedOut,
    RetriesExhausted,
    aclose_backends,
    backend_options,
    backoff_delay,
    make_backend,
    retry_async,
)


@pytest.fixture
def recording(tmp_path):
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({"sessions": [{"a": ["x"]}]}))
    return str(path)


@pytest.fixture(autouse=True)
def fresh_registry():
    registry._instances.clear()
    yield
    registry._instances.clear()


def test_unknown_kind_lists_valid_ones():
    with pytest.raises(BackendError) as info:
        make_backend("llamacpp", "m", {})
    assert str(info.value) == (
        "unknown backend 'llamacpp'; valid backends are 'hf', 'openai', 'vllm', 'python', 'replay'"
    )


def test_instances_are_shared_per_kind_model_and_relevant_options(recording):
    a = make_backend("replay", "policy", {"file": recording})
    b = make_backend("replay", "policy", {"file": recording, "temperature": 0.7})  # not a replay option
    c = make_backend("replay", "key", {"file": recording})
    assert a is b
    assert a is not c
    assert a.name == "replay"


def test_openai_options_split_instances():
    a = make_backend("openai", "m", {"base_url": "http://127.0.0.1:1/v1", "api_key": "k"})
    b = make_backend("openai", "m", {"base_url": "http://127.0.0.1:2/v1", "api_key": "k"})
    assert a is not b
    assert make_backend("openai", "m", {"base_url": "http://127.0.0.1:1/v1", "api_key": "k"}) is a


def test_backend_options_are_constructor_keywords():
    assert backend_options("replay") == ("file",)
    assert {"max_batch", "device", "cache_dir"} <= set(backend_options("hf"))
    assert {"base_url", "api_key_env", "attempts", "max_concurrency"} <= set(backend_options("openai"))


def test_construction_errors_stay_backend_errors():
    with pytest.raises(BackendError, match="the vllm backend needs|vllm could not start"):
        make_backend("vllm", "some/model", {})
    with pytest.raises(BackendError, match="bad options"):
        make_backend("openai", "m", {"attempts": "many"})


async def test_aclose_backends_forgets_instances(recording):
    a = make_backend("replay", "p", {"file": recording})
    await aclose_backends()
    assert make_backend("replay", "p", {"file": recording}) is not a


# -- retry_async ----------------------------------------------------------------------------


class Flaky(Exception):
    pass


async def test_retry_until_success():
    calls = []

    async def fn():
        calls.append(1)
        if len(calls) < 3:
            raise Flaky("not yet")
        return "done"

    retried = []
    out = await retry_async(fn, attempts=5, base_delay=0.001, max_delay=0.002, retry_on=(Flaky,),
                            on_retry=lambda n, exc, delay: retried.append((n, delay)))
    assert out == "done"
    assert len(calls) == 3
    assert [n for n, _ in retried] == [1, 2]
    assert all(0 < d <= 0.002 for _, d in retried)


async def test_non_retryable_propagates_at_once():
    calls = []

    async def fn():
        calls.append(1)
        raise KeyError("fatal")

    with pytest.raises(KeyError):
        await retry_async(fn, attempts=5, base_delay=0.001, max_delay=0.001, retry_on=Flaky)
    assert len(calls) == 1


async def test_exhaustion_raises_from_last_error():
    async def fn():
        raise Flaky("still down")

    with pytest.raises(RetriesExhausted) as info:
        await retry_async(fn, attempts=3, base_delay=0.001, max_delay=0.001,
                          retry_on=lambda exc: isinstance(exc, Flaky))
    assert info.value.attempts == 3
    assert isinstance(info.value.last, Flaky)
    assert info.value.__cause__ is info.value.last
    assert "gave up after 3 attempt(s): Flaky: still down" in str(info.value)


async def test_delay_hint_is_capped():
    seen = []

    async def fn():
        if not seen:
            raise Flaky("429")
        return 1

    await retry_async(fn, attempts=2, base_delay=0.001, max_delay=0.005, retry_on=Flaky,
                      delay_hint=lambda exc: 100.0, on_retry=lambda n, exc, d: seen.append(d))
    assert seen == [0.005]


def test_backoff_grows_jitters_and_caps():
    rng = random.Random(0)
    for attempt in range(1, 12):
        d = backoff_delay(attempt, 0.5, 8.0, rng)
        cap = min(8.0, 0.5 * 2 ** (attempt - 1))
        assert cap / 2 <= d <= cap


def test_attempts_must_be_positive():
    async def fn():
        return 1

    import asyncio

    with pytest.raises(ValueError):
        asyncio.run(retry_async(fn, attempts=0, base_delay=0, max_delay=0, retry_on=Flaky))


# -- bounds: attempt_timeout, deadline, limit ---------------------------------------------------


async def test_attempt_timeout_cancels_and_retries_whatever_retry_on_says():
    import asyncio

    calls, cancelled = [], []

    async def fn():
        calls.append(1)
        if len(calls) == 1:
            try:
                await asyncio.sleep(30)  # a reply that never completes
            except asyncio.CancelledError:
                cancelled.append(1)
                raise
        return "second try"

    out = await retry_async(fn, attempts=2, base_delay=0.001, max_delay=0.001, retry_on=Flaky, attempt_timeout=0.1)
    assert out == "second try" and cancelled == [1]


async def test_every_attempt_timing_out_exhausts_with_the_timeout_as_last_error():
    import asyncio

    async def fn():
        await asyncio.sleep(30)

    with pytest.raises(RetriesExhausted) as info:
        await retry_async(fn, attempts=2, base_delay=0.001, max_delay=0.001, retry_on=Flaky, attempt_timeout=0.05)
    assert isinstance(info.value.last, AttemptTimedOut)
    assert str(info.value) == "gave up after 2 attempt(s): AttemptTimedOut: no complete reply within 0.05s"


async def test_a_timeout_error_of_fns_own_is_not_mistaken_for_ours():
    async def fn():
        raise TimeoutError("the far side's")

    with pytest.raises(TimeoutError, match="the far side's"):
        await retry_async(fn, attempts=3, base_delay=0.001, max_delay=0.001, retry_on=Flaky, attempt_timeout=5)


async def test_deadline_caps_attempts_and_sleeps_together():
    import asyncio

    calls = []

    async def fn():
        calls.append(1)
        await asyncio.sleep(30)

    with pytest.raises(RetriesExhausted) as info:
        await retry_async(fn, attempts=100, base_delay=0.001, max_delay=0.001, retry_on=Flaky,
                          attempt_timeout=0.5, deadline=1.25)
    # 0.5 + 0.5 + what was left (0.25): the third attempt gets only the rest of the deadline
    assert len(calls) == 3 and info.value.attempts == 3 and info.value.deadline == 1.25
    assert "the call's deadline of 1.25s was reached" in str(info.value)
    assert "what was left of the call's deadline" in str(info.value.last)


async def test_no_retry_is_started_when_its_backoff_would_pass_the_deadline():
    calls = []

    async def fn():
        calls.append(1)
        raise Flaky("down")

    with pytest.raises(RetriesExhausted) as info:
        await retry_async(fn, attempts=5, base_delay=10, max_delay=10, retry_on=Flaky, deadline=1)
    assert len(calls) == 1 and info.value.deadline == 1


async def test_waiting_for_the_limit_is_not_counted_against_the_bounds():
    import asyncio

    limit = asyncio.Semaphore(1)
    await limit.acquire()  # someone else holds the only slot for a while
    asyncio.get_running_loop().call_later(0.3, limit.release)

    async def fn():
        return "served"

    out = await retry_async(fn, attempts=1, base_delay=0, max_delay=0, retry_on=Flaky,
                            attempt_timeout=0.1, deadline=0.1, limit=limit)
    assert out == "served"
    assert not limit.locked()  # released after the attempt


@pytest.mark.parametrize("bad", [{"attempt_timeout": 0}, {"deadline": -1}, {"deadline": float("nan")}])
def test_bounds_must_be_positive(bad):
    import asyncio

    async def fn():
        return 1

    with pytest.raises(ValueError, match="must be > 0 seconds"):
        asyncio.run(retry_async(fn, attempts=1, base_delay=0, max_delay=0, retry_on=Flaky, **bad))
