"""Python backend: "module:function" callables, sync and async, with clear errors."""

from __future__ import annotations

import textwrap

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
