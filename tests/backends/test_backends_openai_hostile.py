"""The openai backend against a misbehaving OpenAI-compatible server on loopback.

Whatever the server does (a 200 that is not a chat completion, a reply dripped a byte at a
time, a connection cut mid-body, a status that will never change), the call ends within
its bounds in a BackendError that names the endpoint, after retries when the fault is
transient, and a spec run records it on the session while the other sessions go on.
"""

from __future__ import annotations

import asyncio

import pytest

from fake_openai_server import FakeOpenAIServer
from test_backends_openai import FAST, _req

from askspec.runtime.backends.base import BackendError
from askspec.runtime.backends.openai_backend import OpenAIBackend, parse_completion, MalformedReply
from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

# (server action, what the error says about the body)
MALFORMED = [
    ("raw:text/html|<html><body>502 Bad Gateway</body></html>", "the body is not JSON (text/html, "),
    ("raw:application/json|{not json", "the body is not JSON (application/json, 9 bytes): '{not json'"),
    ("raw:application/json|[1, 2]", "the body is a list, not a chat completion object"),
    ('raw:application/json|{"id": "x"}', "the body has no 'choices'"),
    ('raw:application/json|{"choices": []}', "the body has an empty 'choices' list"),
    ('raw:application/json|{"choices": "abc"}', "the body has 'choices' as a string"),
    ('raw:application/json|{"choices": [7]}', "choices[0] is a number, not an object"),
    ('raw:application/json|{"choices": [{"finish_reason": "stop"}]}', "choices[0] has no 'message' object"),
    ('raw:application/json|{"choices": [{"message": "hi"}]}', "choices[0].message is a string, not an object"),
    ('raw:application/json|{"choices": [{"message": {"content": null}}]}', "choices[0].message.content is null"),
    ('raw:application/json|{"choices": [{"message": {"content": ["a"]}}]}', "choices[0].message.content is a list"),
    ('raw:application/json|{"error": {"message": "quota"}}', "the body has no 'choices' (error: 'quota')"),
    ("raw:application/json|" + "[" * 100_000, "the body is not JSON"),
]


@pytest.mark.parametrize(("action", "expected"), MALFORMED, ids=[e for _, e in MALFORMED])
async def test_malformed_200_is_retried_then_a_clear_error(action, expected):
    async with FakeOpenAIServer(script=[action] * 3) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=3, **FAST)
        with pytest.raises(BackendError) as info:
            await backend.complete(_req())
        await backend.aclose()
    assert len(server.bodies) == 3  # transient: retried like a 5xx
    message = str(info.value)
    assert f"openai endpoint {server.base_url} (model 'served-model') failed 3 time(s) in a row" in message
    assert "malformed reply (HTTP 200): " + expected in message


async def test_a_malformed_reply_then_a_good_one_succeeds():
    async with FakeOpenAIServer(script=["raw:text/html|<html>oops</html>", "ok"]) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=3, **FAST)
        result = await backend.complete(_req("again"))
        await backend.aclose()
    assert result.text == "echo: again"


def test_parse_completion_tolerates_odd_bookkeeping():
    # usage and finish_reason are only bookkeeping: nonsense there does not lose the reply
    body = b'{"choices": [{"message": {"content": "ok"}, "finish_reason": 3}], "usage": {"prompt_tokens": "7", "completion_tokens": true}}'
    assert parse_completion(body, "application/json") == ("ok", "stop", 0, 0)
    assert parse_completion(b'{"choices": [{"message": {"content": ""}, "finish_reason": "length"}]}') == ("", "length", 0, 0)


def test_error_excerpts_escape_control_characters():
    with pytest.raises(MalformedReply) as info:
        parse_completion(b"\x1b[2J\x1b]0;pwned\x07<html>", "text/html")
    assert "\x1b" not in str(info.value) and "\\e[2J" in str(info.value)


async def test_a_server_dripping_bytes_is_cut_off_by_timeout():
    # httpx's timeout is per read: a byte every 0.5 s never trips a 1 s timeout (this hung
    # past 45 s). The attempt as a whole is bounded now.
    async with FakeOpenAIServer(script=["drip", "drip"], drip_interval=0.5) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=2, timeout=1, **FAST)
        with pytest.raises(BackendError) as info:
            await asyncio.wait_for(backend.complete(_req()), timeout=20)
        await backend.aclose()
    message = str(info.value)
    assert f"openai endpoint {server.base_url}" in message
    assert "failed 2 time(s) in a row; last error: timed out: no complete reply within 1s" in message


async def test_deadline_bounds_the_whole_call_across_retries():
    async with FakeOpenAIServer(script=["drip"] * 10, drip_interval=0.5) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=10, timeout=1, deadline=2.5,
                                **FAST)
        with pytest.raises(BackendError) as info:
            await asyncio.wait_for(backend.complete(_req()), timeout=20)
        await backend.aclose()
    assert len(server.bodies) == 3  # 1 s, 1 s, then what was left (0.5 s); no fourth try
    message = str(info.value)
    assert "failed 3 time(s) in a row and its deadline of 2.5s left no time for another" in message
    assert "(what was left of the call's deadline)" in message


async def test_a_connection_cut_mid_body_is_retried_and_says_why():
    async with FakeOpenAIServer(script=["cut", "ok"]) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=2, **FAST)
        assert (await backend.complete(_req("after"))).text == "echo: after"
    async with FakeOpenAIServer(script=["cut", "cut"]) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=2, **FAST)
        with pytest.raises(BackendError, match="failed 2 time.*APIConnectionError.*RemoteProtocolError"):
            await backend.complete(_req())
        await backend.aclose()


async def test_not_implemented_is_not_retried():
    async with FakeOpenAIServer(script=["501", "ok"]) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=5, **FAST)
        with pytest.raises(BackendError, match="refused the request: HTTP 501"):
            await backend.complete(_req())
        await backend.aclose()
    assert len(server.bodies) == 1


async def test_a_reply_far_beyond_max_tokens_is_returned_whole():
    # recording and capping it is the store's business; the backend loses nothing
    async with FakeOpenAIServer(script=["huge"]) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", **FAST)
        result = await backend.complete(_req(max_tokens=8))
        await backend.aclose()
    assert len(result.text) == 2_000_000


@pytest.mark.parametrize("option", ["timeout", "deadline"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_bounds_must_be_positive_and_finite(option, value):
    with pytest.raises(BackendError, match=f"{option} must be a positive number of seconds"):
        OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key="k", **{option: value})


SPEC = """
experiment hostile {{ param n: int = 3 }}
model served = openai("served-model") {{ base_url = "{url}"; retries = 1 }}
role a {{ model = served; memory = none; prompt = "question {{{{ i }}}}" }}
game g for i in range(1, n + 1) {{ x = ask a }}
"""


def test_a_run_records_a_malformed_endpoint_on_the_session_and_goes_on(tmp_path):
    async def go():
        # concurrency 1: the sessions ask in order, so the first gets both bad replies
        async with FakeOpenAIServer(["raw:application/json|{\"choices\": [{}]}"] * 2) as server:
            spec = tmp_path / "hostile.ask"
            spec.write_text(SPEC.format(url=server.base_url))
            rc, run_dir = await run_spec(str(spec), eval_only=True, out=str(tmp_path / "runs"), concurrency=1)
            return rc, run_dir, server

    rc, run_dir, server = asyncio.run(go())
    rows = open_store(run_dir).execute("select status, error from sessions order by session_id").fetchall()
    assert [r[0] for r in rows] == ["error", "ok", "ok"]
    assert f"openai endpoint {server.base_url}" in rows[0][1]
    assert "choices[0] has no 'message' object" in rows[0][1]
    assert "internal error" not in rows[0][1]


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("localhost:8000/v1", "must be an http:// or https:// URL with a host"),
        ("ftp://127.0.0.1/v1", "must be an http:// or https:// URL with a host"),
        ("http://[::1/v1", "is not a valid URL: Invalid IPv6 URL"),
        ("http://127.0.0.1:99999/v1", "is not a valid URL: Port out of range"),
    ],
)
def test_a_bad_base_url_is_refused_when_the_backend_is_made(base_url, expected):
    # before: an internal error (httpx's InvalidURL) at the first call, or five retries of
    # a request that could never be sent
    with pytest.raises(BackendError, match=f"base_url '.*' {expected}"):
        OpenAIBackend("m", base_url=base_url, api_key="k")


@pytest.mark.parametrize("key", ["ключ", "sk-abc\n"])
def test_a_key_no_header_can_carry_is_refused_without_showing_it(monkeypatch, key):
    monkeypatch.setenv("ASKSPEC_TEST_KEY", key)
    with pytest.raises(BackendError) as info:
        OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key_env="ASKSPEC_TEST_KEY")
    assert "the API key in $ASKSPEC_TEST_KEY has characters an HTTP header cannot carry" in str(info.value)
    assert key.strip() not in str(info.value)


async def test_a_nonsense_status_is_not_retried():
    async with FakeOpenAIServer(script=["raw-status:999"] * 3) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=3, **FAST)
        with pytest.raises(BackendError, match="refused the request: HTTP 999"):
            await backend.complete(_req())
        await backend.aclose()
    assert len(server.bodies) == 1


async def test_whatever_the_client_raises_is_a_backend_error_naming_the_endpoint():
    backend = OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key="k", extra_body={"when": object()})
    with pytest.raises(BackendError, match=r"openai endpoint http://127.0.0.1:9/v1 \(model 'served-model'\): the request failed: TypeError"):
        await backend.complete(_req())
    await backend.aclose()


# ------------------------------------------------------------------ a body past the cap

CAP = 256 * 1024  # a small max_response_bytes, so the tests move little data


@pytest.mark.parametrize(("action", "expected"), [
    ("300MB", "reply too large: the server announced a body of 286 MiB, over 256 KiB (max_response_bytes = 262144)"),
    ("endless", "reply too large: the body passed 256 KiB and was cut off there (max_response_bytes = 262144)"),
    ("endless-500", "reply too large: the body passed 256 KiB and was cut off there"),
    ("gzip", "malformed reply (HTTP 200): the body is compressed (gzip) though an uncompressed one was asked for"),
])
async def test_a_body_past_the_cap_fails_the_call_and_memory_stays_small(action, expected):
    import tracemalloc

    async with FakeOpenAIServer(script=[action] * 2) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=2, timeout=30,
                                max_response_bytes=CAP, **FAST)
        tracemalloc.start()
        try:
            with pytest.raises(BackendError) as info:
                await asyncio.wait_for(backend.complete(_req()), timeout=20)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await backend.aclose()
    assert len(server.bodies) == 2  # retried like a malformed reply, then the call fails
    assert f"openai endpoint {server.base_url} (model 'served-model') failed 2 time(s) in a row" in str(info.value)
    assert expected in str(info.value)
    # (before: the endless body grew until the machine ran out of memory)
    assert peak < 8 * CAP + 2_000_000, f"{peak / 1e6:.1f} MB held while reading a body capped at {CAP} bytes"
    assert server.headers[0].get("accept-encoding") == "identity"


async def test_a_body_within_the_cap_is_read_as_before():
    async with FakeOpenAIServer(script=["huge"]) as server:
        backend = OpenAIBackend("m", base_url=server.base_url, api_key="k", attempts=1, **FAST)  # default cap
        assert backend.max_response_bytes == 16 * 1024 * 1024
        assert len((await backend.complete(_req())).text) == 2_000_000
        await backend.aclose()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "16MB", True])
def test_max_response_bytes_must_be_a_positive_whole_number(bad):
    with pytest.raises(BackendError, match="max_response_bytes must be a positive number of bytes"):
        OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key="k", max_response_bytes=bad)


async def test_a_spec_sets_max_response_bytes(tmp_path):
    spec = tmp_path / "s.ask"
    async with FakeOpenAIServer(script=["huge"] * 3) as server:
        spec.write_text(f'model m = openai("served-model", base_url = "{server.base_url}", retries = 0, '
                        f'max_response_bytes = {CAP})\nrole judge {{ model = m; prompt = "hi" }}\n'
                        "game g {\n    ask judge\n}\n")
        rc, run_dir = await run_spec(str(spec), eval_only=True, out=str(tmp_path / "runs"), sessions=1)
    (error,) = open_store(run_dir).execute("SELECT error FROM sessions").fetchone()
    assert "reply too large: the server announced a body of 1.91 MiB, over 256 KiB" in error
