"""The trained role's token sequence (tokens.Conversation) across recovery turns, a
re-sampled prompt and a memory that forgets a recovered attempt: one sequence, with
an action range per generated turn and none for a discarded attempt."""

from __future__ import annotations

import asyncio

import pytest

from askspec.runtime.backends.base import ChatRequest, Sampling
from askspec.runtime.targets.openrlhf.tokens import Conversation

from openrlhf_harness import FakeEngine, FakeSamplingParams, smollm2_tokenizer

pytestmark = pytest.mark.slow  # the SmolLM2 tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


def test_recovery_resample_and_forgotten_attempts(tokenizer) -> None:
    replies = iter(["no tags here", "#Question# What is 2+2?", "#Question# draft", "#Question# What is 3+3?"])
    engine = FakeEngine(None, tokenizer, lambda prompt: next(replies))
    conv = Conversation(tokenizer=tokenizer, engine=engine, sampling_params=FakeSamplingParams(logprobs=1),
                        max_length=2048)
    sys_, u1, rec, u2 = ({"role": "system", "content": "You ask questions."}, {"role": "user", "content": "Probe 1"},
                         {"role": "user", "content": "Your reply had no #Question#."}, {"role": "user", "content": "Probe 2"})

    async def call(messages):
        return await conv.chat(ChatRequest(messages=tuple(messages), sampling=Sampling(max_tokens=64), role="q"))

    async def play():
        r1 = await call([sys_, u1])  # fails to parse
        r2 = await call([sys_, u1, {"role": "assistant", "content": r1.text}, rec])  # the recovery turn
        # the engine's memory keeps only the accepted reply; the sequence keeps the attempt
        r3 = await call([sys_, u1, {"role": "assistant", "content": r2.text}, u2])
        r4 = await call([sys_, u1, {"role": "assistant", "content": r2.text}, u2])  # the same prompt again: re-sample
        return r1, r2, r3, r4

    r1, r2, r3, r4 = asyncio.run(play())
    assert [r.text for r in (r1, r2, r3, r4)] == ["no tags here", "#Question# What is 2+2?", "#Question# draft",
                                                   "#Question# What is 3+3?"]
    assert conv.kept_attempts == 1
    assert conv.call_ranges == [0, 1, None, 2]  # the discarded draft has no range
    assert [tokenizer.decode(conv.ids[s:e], skip_special_tokens=True) for s, e in conv.ranges] == [
        "no tags here", "#Question# What is 2+2?", "#Question# What is 3+3?"]
    expected = tokenizer.apply_chat_template(
        [sys_, u1, {"role": "assistant", "content": r1.text}, rec, {"role": "assistant", "content": r2.text}, u2],
        add_generation_prompt=True, tokenize=False) + "#Question# What is 3+3?<|im_end|>"
    assert tokenizer.decode(conv.ids) == expected
    assert len(conv.logprobs) == len(conv.ids)
    assert [conv.logprobs[i] for s, e in conv.ranges for i in range(s, e)] == [-0.5] * sum(e - s for s, e in conv.ranges)


def test_no_room_left_is_a_truncated_turn_without_a_range(tokenizer) -> None:
    engine = FakeEngine(None, tokenizer, lambda prompt: "word " * 50)
    conv = Conversation(tokenizer=tokenizer, engine=engine, sampling_params=FakeSamplingParams(), max_length=40)

    async def play():
        m = [{"role": "user", "content": "Go"}]
        first = await conv.chat(ChatRequest(messages=tuple(m), sampling=Sampling(max_tokens=64)))
        assert len(conv.ids) == 40  # the reply was cut at the sequence budget
        m += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "More"}]
        second = await conv.chat(ChatRequest(messages=tuple(m), sampling=Sampling(max_tokens=64)))
        return first, second

    first, second = asyncio.run(play())
    assert first.finish_reason == "length" and len(conv.ids) > 40  # the next user turn was still appended
    assert second.finish_reason == "length" and second.text == ""
    assert conv.call_ranges == [0, None] and conv.truncated
