"""OpenAI backend against a real HTTP server on 127.0.0.1 speaking chat completions.

The server is a small asyncio HTTP/1.1 responder: each request takes the next action from
a script ("ok", "500", "429", "400", "hang", and the misbehaviours in `_act`: "501",
"raw:<content-type>|<body>", "raw-status:<code>", "drip", "cut", "huge"), so tests can inject failures and
check that the backend's retries absorb them, that sampling fields reach the wire, and
that the per-endpoint concurrency limit holds.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import deque

import pytest

from askspec.runtime.backends.base import BackendError, ChatRequest, Sampling
from askspec.runtime.backends.openai_backend import OpenAIBackend, chat_kwargs

FAST = {"base_delay": 0.001, "max_delay": 0.01}  # keep backoff tiny in tests


class FakeOpenAIServer:
    def __init__(self, script: list[str] | None = None, delay: float = 0.0, drip_interval: float = 0.5,
                 drip_limit: int = 80, served: list[str] | None = None) -> None:
        self.script: deque[str] = deque(script or [])
        self.served = served  # the model names GET /v1/models lists (None: no such route)
        self.delay = delay
        self.drip_interval = drip_interval  # "drip": seconds between bytes
        self.drip_limit = drip_limit  # "drip": bytes sent at most, then the server hangs up
        self.bodies: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> "FakeOpenAIServer":
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await reader.readline()
            if not request_line:
                return
            headers: dict[str, str] = {}
            for _ in range(100):  # bounded header loop
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            method, path, _ = request_line.decode("latin-1").split(" ", 2)
            if method == "GET" and path == "/v1/models" and self.served is not None:
                await self._send(writer, 200, {"object": "list", "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "test"} for name in self.served]})
                return
            if method != "POST" or path != "/v1/chat/completions":
                await self._send(writer, 404, {"error": {"message": f"no route {method} {path}"}})
                return
            payload = json.loads(body)
            self.bodies.append(payload)
            self.headers.append(headers)
            action = self.script.popleft() if self.script else "ok"
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await self._act(action, payload, reader, writer)
            finally:
                self.in_flight -= 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _act(self, action: str, payload: dict, reader, writer) -> None:
        if action == "hang":
            # Never answer: wait until the client gives up and closes (bounded for safety).
            try:
                await asyncio.wait_for(reader.read(), timeout=10)
            except asyncio.TimeoutError:
                pass
            return
        if action == "500":
            await self._send(writer, 500, {"error": {"message": "upstream exploded", "type": "server_error"}})
            return
        if action == "429":
            await self._send(writer, 429, {"error": {"message": "slow down", "type": "rate_limit"}},
                             extra_headers={"retry-after": "0"})
            return
        if action == "400":
            await self._send(writer, 400, {"error": {"message": "bad field 'top_q'", "type": "invalid_request"}})
            return
        if action == "501":
            await self._send(writer, 501, {"error": {"message": "chat is not implemented here"}})
            return
        if action.startswith("raw-status:"):  # a status no standard defines
            writer.write(f"HTTP/1.1 {action[11:]} Odd\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}".encode())
            await writer.drain()
            return
        if action.startswith("raw:"):  # a 200 with this content type and body, verbatim
            content_type, _, body = action[4:].partition("|")
            await self._send_bytes(writer, 200, body.encode(), content_type)
            return
        if action == "cut":  # promise 1000 bytes, send a few, hang up
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
                         b"Connection: close\r\n\r\n{\"choi")
            await writer.drain()
            return
        if action == "drip":  # a valid reply, one byte per drip_interval, until drip_limit or hang-up
            data = self._response_bytes(200, self._completion(payload, "dripped"), "application/json")
            client_gone = asyncio.ensure_future(reader.read())
            try:
                for i in range(min(len(data), self.drip_limit)):
                    writer.write(data[i:i + 1])
                    await writer.drain()
                    await asyncio.wait([client_gone], timeout=self.drip_interval)
                    if client_gone.done():
                        return
            finally:
                client_gone.cancel()
            return
        if action in ("endless", "endless-500", "300MB"):  # a body without end (or of 300 MB), in chunks,
            status = "500 Internal Server Error" if action == "endless-500" else "200 OK"  # until the client goes
            length = "Content-Length: 300000000" if action == "300MB" else "Transfer-Encoding: chunked"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{length}\r\n"
                         "Connection: close\r\n\r\n".encode())
            chunk = b'{"choices": [{"message": {"content": "' + b"x" * 65536
            frame = chunk if action == "300MB" else f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            for _ in range(4096 if action == "300MB" else 64 * 1024):  # (the client hangs up long before)
                writer.write(frame)
                await writer.drain()
            return
        if action == "gzip":  # 10 MB of zeros as ~10 KB of gzip, though asked for no compression
            import zlib

            packer = zlib.compressobj(wbits=31)  # gzip, packed a piece at a time (little memory here)
            zeros = b"0" * 65536
            data = b"".join(packer.compress(zeros) for _ in range(150)) + packer.flush()
            await self._send_bytes(writer, 200, data, "application/json", {"Content-Encoding": "gzip"})
            return
        if action == "huge":  # ignores max_tokens: 2 MB of text
            body = self._completion(payload, "x" * 2_000_000)
            await self._send(writer, 200, body)
            return
        await asyncio.sleep(self.delay)
        await self._send(writer, 200, self._completion(payload, f"echo: {payload['messages'][-1]['content']}"))

    def _completion(self, payload: dict, text: str) -> dict:
        short = payload.get("max_tokens", 16) < 3
        prompt_tokens = sum(len(m["content"].split()) for m in payload["messages"])
        return {
            "id": f"chatcmpl-{len(self.bodies)}",
            "object": "chat.completion",
            "created": 0,
            "model": payload["model"],
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length" if short else "stop",
            }],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2,
                      "total_tokens": prompt_tokens + 2},
        }

    @classmethod
    async def _send(cls, writer, status: int, obj: dict, extra_headers: dict[str, str] | None = None) -> None:
        await cls._send_bytes(writer, status, json.dumps(obj).encode(), "application/json", extra_headers)

    @classmethod
    async def _send_bytes(cls, writer, status: int, data: bytes, content_type: str,
                          extra_headers: dict[str, str] | None = None) -> None:
        writer.write(cls._response_bytes(status, data, content_type, extra_headers))
        await writer.drain()

    @staticmethod
    def _response_bytes(status: int, data: bytes | dict, content_type: str,
                        extra_headers: dict[str, str] | None = None) -> bytes:
        if isinstance(data, dict):
            data = json.dumps(data).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
                  500: "Internal Server Error", 501: "Not Implemented"}[status]
        head = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}",
                f"Content-Length: {len(data)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in (extra_headers or {}).items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + data


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
