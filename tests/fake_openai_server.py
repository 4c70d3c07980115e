"""A real HTTP server on 127.0.0.1 speaking OpenAI chat completions, for the tests of
the OpenAI backend and of runs against an endpoint (tests/backends, tests/engine,
tests/commands): each request takes the next action from a script ("ok", "500", "429",
"400", "hang", and the misbehaviours in `_act`: "501", "raw:<content-type>|<body>",
"raw-status:<code>", "drip", "cut", "huge"), so tests can inject failures. It sits
beside tests/conftest.py, whose folder pytest puts on sys.path (as fake_models.py)."""

from __future__ import annotations

import asyncio
import json
from collections import deque


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
