"""A backend's time to first token (ChatResult.ttft_ms) reaches the run store's turns;
a callable's ChatResult with a ttft that is not a number is refused, naming the callable."""

from __future__ import annotations

import asyncio

import pytest

from askspec.runtime.backends.base import BackendError, ChatRequest, ChatResult
from askspec.runtime.backends.python_backend import PythonBackend
from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

SPEC = """
experiment ttft { param n: int = 2 }
model m = python("fake_models:with_ttft")
model plain = python("fake_models:always_one")
role a { model = m; memory = none; prompt = "go {{ i }}" }
role b { model = plain; memory = none; prompt = "go {{ i }}" }
game g for i in range(0, n) {
    x = ask a
    y = ask b
}
"""


def test_ttft_is_recorded_per_turn_and_null_where_the_backend_does_not_say(tmp_path):
    spec = tmp_path / "ttft.ask"
    spec.write_text(SPEC)
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs")))
    assert rc == 0
    got = open_store(run_dir).execute("select role, ttft_ms from turns order by role, session_id").fetchall()
    assert got == [("a", 7.5), ("a", 7.5), ("b", None), ("b", None)]


def test_a_callable_result_with_a_ttft_that_is_not_a_number_is_refused(monkeypatch):
    import fake_models

    monkeypatch.setattr(fake_models, "with_ttft", lambda messages, request: ChatResult(text="x", ttft_ms="soon"))
    backend = PythonBackend("fake_models:with_ttft")
    with pytest.raises(BackendError, match="ttft_ms must be a number"):
        asyncio.run(backend.complete(ChatRequest(messages=({"role": "user", "content": "hi"},))))
