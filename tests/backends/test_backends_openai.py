"""OpenAI backend against a real HTTP server on 127.0.0.1 speaking chat completions
(tests/fake_openai_server.py, a small asyncio HTTP/1.1 responder playing a script of
actions): the backend's retries absorb injected failures, sampling fields reach the wire,
and the per-endpoint concurrency limit holds.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from askspec.runtime.backends.base import BackendError, ChatRequest, Sampling
from askspec.runtime.backends.openai_backend import OpenAIBackend, chat_kwargs

from fake_openai_server import FakeOpenAIServer  # (tests/, on sys.path: tests/conftest.py)

FAST = {"base_delay": 0.001, "max_delay": 0.01}  # keep backoff tiny in tests


def _req(text: str = "hello", **sampling) -> ChatRequest:
    return ChatRequest(messages=({"role": "system", "content": "be brief"}, {"role": "user", "content": text}),
                       sampling=Sampling(**sampling), model="served-model", role="judge")


async def test_roundtrip_usage_finish_reason_and_fields_on_the_wire(monkeypatch):
    monkeypatch.setenv("ASKSPEC_TEST_KEY", "sk-test-123")
    async with FakeOpenAIServer() as server:
        backend = OpenAIBackend("served-model", base_url=server.base_url, api_key_env="ASKSPEC_TEST_KEY", **FAST)
        result = await backend.complete(_req(
            "what is 2+2", temperature=0.3, top_p=0.9, top_k=20, min_p=0.05, presence_penalty=0.4,
            repetition_penalty=1.2, max_tokens=32, stop=("</a>",), seed=11,
        ))
        short = await backend.complete(_req("x", max_tokens=2))
        await backend.aclose()
    assert result.text == "echo: what is 2+2"
    assert (result.finish_reason, result.tokens_in, result.tokens_out) == ("stop", 5, 2)
    assert result.latency_ms > 0
    assert short.finish_reason == "length"
    body = server.bodies[0]
    assert body["model"] == "served-model"
    assert body["messages"][-1] == {"role": "user", "content": "what is 2+2"}
    native = {k: body[k] for k in ("temperature", "top_p", "presence_penalty", "max_tokens", "stop", "seed")}
    assert native == {"temperature": 0.3, "top_p": 0.9, "presence_penalty": 0.4, "max_tokens": 32,
                      "stop": ["</a>"], "seed": 11}
    # Non-OpenAI fields arrive as top-level body fields via extra_body (vLLM reads them there).
    assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (20, 0.05, 1.2)
    assert server.headers[0]["authorization"] == "Bearer sk-test-123"


async def test_unset_fields_are_not_sent():
    async with FakeOpenAIServer() as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", **FAST)
        await backend.complete(_req())
        await backend.aclose()
    body = server.bodies[0]
    for absent in ("top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop", "presence_penalty"):
        assert absent not in body


async def test_options_extra_body_is_merged():
    async with FakeOpenAIServer() as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k",
                                extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **FAST)
        await backend.complete(_req(top_k=5))
        await backend.aclose()
    assert server.bodies[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert server.bodies[0]["top_k"] == 5


async def test_retries_absorb_500_429_and_a_hanging_response():
    async with FakeOpenAIServer(script=["500", "429", "hang", "ok"]) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=5, timeout=0.5, **FAST)
        result = await backend.complete(_req("survive"))
        await backend.aclose()
    assert result.text == "echo: survive"
    assert len(server.bodies) == 4


async def test_permanent_failure_raises_after_n_attempts():
    async with FakeOpenAIServer(script=["500"] * 10) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=3, **FAST)
        with pytest.raises(BackendError) as info:
            await backend.complete(_req())
        await backend.aclose()
    assert len(server.bodies) == 3
    message = str(info.value)
    assert f"openai endpoint {server.base_url} (model 'served-model') failed 3 time(s) in a row" in message
    assert "HTTP 500" in message


async def test_timeouts_alone_exhaust_attempts():
    async with FakeOpenAIServer(script=["hang"] * 3) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=2, timeout=0.2, **FAST)
        with pytest.raises(BackendError, match="failed 2 time"):
            await backend.complete(_req())
        await backend.aclose()
    assert len(server.bodies) == 2


async def test_client_errors_are_not_retried():
    async with FakeOpenAIServer(script=["400", "ok"]) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=5, **FAST)
        with pytest.raises(BackendError) as info:
            await backend.complete(_req())
        await backend.aclose()
    assert len(server.bodies) == 1
    assert "refused the request: HTTP 400" in str(info.value)
    assert "top_q" in str(info.value)


async def test_connection_refused_raises_after_attempts():
    with socket.socket() as s:  # find a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = OpenAIBackend("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", attempts=2, **FAST)
    with pytest.raises(BackendError, match="failed 2 time.*APIConnectionError"):
        await backend.complete(_req())
    await backend.aclose()


async def test_concurrency_limit_is_shared_per_endpoint():
    async with FakeOpenAIServer(delay=0.05) as server:
        # Two backends (two served models) on one endpoint share its limit of 2.
        a = OpenAIBackend("model-a", base_url=server.base_url, api_key="k", max_concurrency=2, **FAST)
        b = OpenAIBackend("model-b", base_url=server.base_url, api_key="k", max_concurrency=2, **FAST)
        results = await asyncio.gather(*[(a if i % 2 else b).complete(_req(f"n{i}")) for i in range(8)])
        await a.aclose()
        await b.aclose()
    assert [r.text for r in results] == [f"echo: n{i}" for i in range(8)]
    assert len(server.bodies) == 8
    assert server.max_in_flight == 2


async def test_without_limit_pressure_calls_overlap():
    async with FakeOpenAIServer(delay=0.05) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", max_concurrency=8, **FAST)
        await asyncio.gather(*[backend.complete(_req(f"n{i}")) for i in range(6)])
        await backend.aclose()
    assert server.max_in_flight > 2  # the limit, not the client, was what serialised above


def test_missing_named_key_env(monkeypatch):
    monkeypatch.delenv("ASKSPEC_NO_SUCH_KEY", raising=False)
    with pytest.raises(BackendError, match="environment variable ASKSPEC_NO_SUCH_KEY"):
        OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key_env="ASKSPEC_NO_SUCH_KEY")


def test_base_url_from_env(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1234/v1/")
    assert OpenAIBackend("m").base_url == "http://127.0.0.1:1234/v1"


def test_chat_kwargs_mapping():
    assert chat_kwargs(Sampling()) == {"max_tokens": 256, "temperature": 1.0}
    kw = chat_kwargs(Sampling(top_k=3, min_p=0.1, repetition_penalty=1.05, seed=0))
    assert kw["extra_body"] == {"top_k": 3, "min_p": 0.1, "repetition_penalty": 1.05}
    assert kw["seed"] == 0


async def test_several_endpoints_share_the_load():
    """`base_url` as a list: calls spread over the servers by calls in flight, so slow
    concurrent calls land evenly and each server sees a share."""
    async with FakeOpenAIServer(delay=0.05) as a, FakeOpenAIServer(delay=0.05) as b, \
            FakeOpenAIServer(delay=0.05) as c:
        backend = OpenAIBackend("m", base_url=[a.base_url, b.base_url, c.base_url], api_key="k", **FAST)
        results = await asyncio.gather(*(backend.complete(_req(f"q{i}")) for i in range(12)))
        await backend.aclose()
    assert sorted(r.text for r in results) == sorted(f"echo: q{i}" for i in range(12))
    assert [len(s.bodies) for s in (a, b, c)] == [4, 4, 4]
    assert backend.base_urls == [a.base_url, b.base_url, c.base_url]


async def test_a_retry_moves_to_another_endpoint():
    async with FakeOpenAIServer(script=["500", "500", "500"]) as bad, FakeOpenAIServer() as good:
        backend = OpenAIBackend("m", base_url=[bad.base_url, good.base_url], api_key="k", attempts=2, **FAST)
        results = [await backend.complete(_req(f"q{i}")) for i in range(3)]
        await backend.aclose()
    assert [r.text for r in results] == ["echo: q0", "echo: q1", "echo: q2"]  # never failed twice in a row
    assert len(bad.bodies) <= 3 and len(good.bodies) == 3
