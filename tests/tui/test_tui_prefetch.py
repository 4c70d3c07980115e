"""``TranscriptCache``: a value fetched once is kept (LRU), a fetch already running is
waited for rather than run twice, ``fresh`` reads again, a failed fetch is not kept."""

from __future__ import annotations

import threading
import time

import pytest

from askspec.tui.prefetch import TranscriptCache


def test_a_fetched_value_is_kept_and_the_oldest_dropped():
    cache = TranscriptCache(size=2)
    calls = []

    def fn(k):
        calls.append(k)
        return f"value {k}"

    assert cache.get("a") is None
    assert cache.fetch("a", fn, "a") == "value a"
    assert cache.fetch("a", fn, "a") == "value a" and calls == ["a"]
    assert cache.get("a") == "value a"
    cache.fetch("b", fn, "b")
    cache.get("a")  # a used last: b is the oldest
    cache.fetch("c", fn, "c")
    assert cache.get("b") is None and cache.get("a") == "value a" and cache.get("c") == "value c"
    assert cache.fetch("a", fn, "a", fresh=True) == "value a" and calls == ["a", "b", "c", "a"]


def test_a_running_fetch_is_waited_for_not_run_twice():
    cache = TranscriptCache()
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow(k):
        calls.append(k)
        started.set()
        release.wait(5)
        return k * 2

    results = []
    first = threading.Thread(target=lambda: results.append(cache.fetch("k", slow, "k")))
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=lambda: results.append(cache.fetch("k", slow, "k")))
    second.start()
    time.sleep(0.05)
    assert cache.get("k") is None  # still running
    release.set()
    first.join(5)
    second.join(5)
    assert results == ["kk", "kk"] and calls == ["k"]


def test_a_failed_fetch_is_not_kept():
    cache = TranscriptCache()

    def bad():
        raise ValueError("no such session")

    with pytest.raises(ValueError):
        cache.fetch("k", bad)
    assert cache.get("k") is None
    assert cache.fetch("k", lambda: 3) == 3
