"""hf backend on the real SmolLM2-135M-Instruct weights (slow: loads a model).

The first run converts the GGUF file into the default cache (~15 s); later runs load the
cached safetensors in under a second. Every generation here is short (max_tokens <= 16).
The module loads SmolLM2 once (served with and without the prefix cache) and plays each
reference conversation without reuse once (`alone`); the cache's bookkeeping tests (a
weight update, the bounds) run on the tiny random model (tests/conftest.py `tiny_model`).
"""

from __future__ import annotations

import asyncio

import pytest

from askspec.runtime.backends.base import BackendError, ChatRequest, ChatResult, Sampling
from askspec.runtime.backends.hf import HFBackend, resolve_weights

GREEDY = dict(temperature=0.0)


def _req(text: str, **sampling) -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": text},), sampling=Sampling(**sampling),
                       model="smollm2-135m-instruct", role="solver")


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(BackendError, match="unknown model 'no-such-model'"):
        HFBackend("no-such-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BackendError, match="has no config.json"):
        HFBackend(str(tmp_path / "empty"))


def test_bad_options_are_clear():
    with pytest.raises(BackendError, match="max_batch must be >= 1"):
        HFBackend(max_batch=0)


@pytest.fixture(scope="module")
def backend():
    b = HFBackend("smollm2-135m-instruct", max_batch=8)
    b.load()
    yield b
    asyncio.run(b.aclose())


@pytest.mark.slow
async def test_chat_template_and_token_counts(backend):
    result = await backend.complete(_req("What is the capital of France?", max_tokens=16, **GREEDY))
    assert isinstance(result, ChatResult)
    assert "Paris" in result.text
    expected_in = backend._tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    assert result.tokens_in == len(expected_in)
    assert 0 < result.tokens_out <= 16
    assert result.latency_ms > 0
    # the first token comes after the call starts and no later than the whole reply
    assert result.ttft_ms is not None and 0 < result.ttft_ms <= result.latency_ms
    if result.finish_reason == "stop":  # ended on <|im_end|>, which is counted but not shown
        assert "<|im_end|>" not in result.text


@pytest.mark.slow
async def test_max_tokens_gives_length(backend):
    result = await backend.complete(_req("Write a long story about a dragon.", max_tokens=5, **GREEDY))
    assert result.finish_reason == "length"
    assert result.tokens_out == 5


@pytest.mark.slow
async def test_same_seed_same_text(backend):
    req = _req("Name an animal.", temperature=1.0, top_p=0.95, seed=1234, max_tokens=10)
    first = await backend.complete(req)
    second = await backend.complete(req)
    assert first.text == second.text
    # Same seed, now batched with other rows: the row keeps its own random stream.
    crowd = await asyncio.gather(
        backend.complete(_req("Tell me a joke.", temperature=1.0, seed=7, max_tokens=10)),
        backend.complete(req),
        backend.complete(_req("Name a city.", temperature=0.5, top_k=10, max_tokens=6)),
    )
    assert crowd[1].text == first.text
    others = [await backend.complete(_req("Name an animal.", temperature=1.0, seed=s, max_tokens=10))
              for s in (1, 2, 3)]
    assert len({first.text, *(o.text for o in others)}) > 1  # seeds do change the sample


@pytest.mark.slow
async def test_stop_string_is_cut_and_reported(backend):
    full = await backend.complete(_req("Count from one to ten in words.", max_tokens=16, **GREEDY))
    words = full.text.split()
    assert len(words) >= 4, full.text
    stop = words[2]
    cut = await backend.complete(_req("Count from one to ten in words.", max_tokens=16, stop=(stop,), **GREEDY))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    assert stop not in cut.text
    assert cut.tokens_out < full.tokens_out


@pytest.mark.slow
async def test_concurrent_requests_batch_and_match_one_at_a_time(backend):
    prompts = ["Say hi.", "What is 2+2?", "Name a colour.", "List two fruits.", "What is the sun?", "Greet me."]
    lengths = [6, 8, 10, 12, 14, 16]
    alone = [await backend.complete(_req(p, max_tokens=n, **GREEDY)) for p, n in zip(prompts, lengths)]
    together = await asyncio.gather(*[backend.complete(_req(p, max_tokens=n, **GREEDY))
                                      for p, n in zip(prompts, lengths)])
    for a, t, n in zip(alone, together, lengths):
        assert isinstance(t, ChatResult)
        assert t.tokens_out <= n
        assert t.finish_reason in ("stop", "length")
        # Left padding and rows joining/leaving must not change greedy output.
        assert (t.text, t.tokens_in, t.tokens_out) == (a.text, a.tokens_in, a.tokens_out)


@pytest.mark.slow
async def test_requests_joining_a_running_batch(backend):
    """Rows admitted mid-flight (own prefill, merged with left padding) decode as if alone."""
    reqs = [_req("Describe the moon.", max_tokens=16, **GREEDY),
            _req("Hello there!", max_tokens=10, **GREEDY),
            _req("Why is grass green? Explain it like I am five years old, please.", max_tokens=10, **GREEDY)]
    alone = [await backend.complete(r) for r in reqs]
    first = asyncio.create_task(backend.complete(reqs[0]))
    await asyncio.sleep(0.3)
    second = asyncio.create_task(backend.complete(reqs[1]))
    await asyncio.sleep(0.2)
    third = asyncio.create_task(backend.complete(reqs[2]))
    joined = await asyncio.gather(first, second, third)
    assert [(r.text, r.tokens_out) for r in joined] == [(r.text, r.tokens_out) for r in alone]


@pytest.mark.slow
async def test_mixed_sampling_params_in_one_batch(backend):
    reqs = [
        _req("Tell me about cats.", max_tokens=8, **GREEDY),
        _req("Tell me about dogs.", max_tokens=8, temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=3),
        _req("Tell me about birds.", max_tokens=8, temperature=1.0, repetition_penalty=1.3,
             presence_penalty=0.5, seed=4),
        _req("Tell me about fish.", max_tokens=8, temperature=0.7, stop=(".",), seed=5),
        _req("Tell me about frogs.", max_tokens=8, seed=2**80 + 5),  # engine seeds are hashes
        _req("Tell me about owls.", max_tokens=8, seed=-3),
    ]
    alone_greedy = await backend.complete(reqs[0])
    results = await asyncio.gather(*[backend.complete(r) for r in reqs])
    assert results[0].text == alone_greedy.text
    assert all(0 < r.tokens_out <= 8 for r in results)
    assert "." not in results[3].text


@pytest.mark.slow
async def test_cancelled_request_does_not_disturb_others(backend):
    keep = asyncio.create_task(backend.complete(_req("Say hello.", max_tokens=6, **GREEDY)))
    drop = asyncio.create_task(backend.complete(_req("Write an essay.", max_tokens=16, **GREEDY)))
    await asyncio.sleep(0.05)
    drop.cancel()
    result = await keep
    assert result.tokens_out > 0
    with pytest.raises(asyncio.CancelledError):
        await drop


@pytest.mark.slow
def test_weights_are_cached_as_safetensors():
    folder = resolve_weights("smollm2-135m-instruct")
    assert (folder / "config.json").is_file()
    assert any(folder.glob("*.safetensors"))
    assert (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


def test_cache_root_follows_env(monkeypatch, tmp_path):
    from askspec.runtime.backends.hf import cache_root

    monkeypatch.setenv("ASKSPEC_CACHE", str(tmp_path))
    assert cache_root() == tmp_path / "models"
    assert cache_root(tmp_path / "elsewhere") == tmp_path / "elsewhere"
    monkeypatch.delenv("ASKSPEC_CACHE")
    assert cache_root().parts[-3:] == (".cache", "askspec", "models")


async def test_load_failure_reaches_the_caller(tmp_path):
    folder = tmp_path / "broken-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "not-a-real-architecture"}')
    backend = HFBackend(str(folder))
    with pytest.raises(BackendError, match="could not load"):
        await asyncio.wait_for(backend.complete(_req("hi", max_tokens=2)), timeout=60)
    await backend.aclose()


@pytest.mark.slow
async def test_tokens_are_reported_as_they_are_generated(backend):
    """Each generated token is reported through on_tokens while the request runs (the
    progress line's count), from the worker thread, before the result arrives."""
    seen: list[tuple[int, bool]] = []
    future_box: list[asyncio.Future] = []

    def on_tokens(n: int) -> None:
        seen.append((n, bool(future_box) and future_box[0].done()))

    req = ChatRequest(messages=({"role": "user", "content": "Count to twenty."},), sampling=Sampling(max_tokens=12, **GREEDY),
                      model="smollm2-135m-instruct", role="solver", on_tokens=on_tokens)
    task = asyncio.ensure_future(backend.complete(req))
    future_box.append(task)
    result = await task
    assert sum(n for n, _ in seen) == result.tokens_out == len(seen)
    assert not any(done for _, done in seen)


# -- prefix cache: a conversation's turns reuse the keys/values of its history ----------

TURNS = ["Tell me a short fact about the moon.", "Why is that?", "Say it again in one sentence."]
OPENERS = ["Tell me a short fact about the moon.", "Name three rivers in Europe and one thing about each.",
           "What is a prime number? Give two examples, then explain why 1 is not prime."]


async def _conversation(backend: HFBackend, opener: str, turns: int = 3, **options) -> list[tuple[int, str]]:
    """A `memory = full` role's calls: each prompt is the history so far plus a new user turn.
    Replies are 8 tokens: each later turn's prompt still holds the earlier replies (keys and
    values computed one decode step at a time, then reused), and decoding is the cost."""
    history: list[dict[str, str]] = []
    out = []
    for user in [opener, *TURNS[1:turns]]:
        messages = ({"role": "system", "content": "You answer briefly."}, *history, {"role": "user", "content": user})
        r = await backend.complete(ChatRequest(messages=messages, sampling=Sampling(max_tokens=8, **GREEDY),
                                               role="solver", options=options))
        out.append((r.tokens_out, r.text))
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": r.text}]
    return out


@pytest.fixture(scope="module")
def no_reuse(backend):
    """The same SmolLM2 (the very model `backend` loaded, `adopt`) served without reuse."""
    b = HFBackend("smollm2-135m-instruct", max_batch=8, prefix_cache=False)
    b.adopt(backend._model, backend._tokenizer)
    yield b
    asyncio.run(b.aclose())


@pytest.fixture(scope="module")
def alone(no_reuse):
    """`await alone(opener, turns=3)`: the conversation played alone on the backend without
    reuse, its reference. Played once a module and kept: greedy decoding gives the same
    tokens every time, and a shorter conversation is the longer one's first turns (each
    prompt is the history so far)."""
    played: dict[str, list[tuple[int, str]]] = {}

    async def get(opener: str, turns: int = 3) -> list[tuple[int, str]]:
        if opener not in played:
            played[opener] = await _conversation(no_reuse, opener)
        return played[opener][:turns]

    return get


@pytest.mark.slow
async def test_reuse_gives_the_same_greedy_tokens_one_conversation_at_a_time(backend, no_reuse, alone):
    backend.forget_prefixes()
    before = backend.prefix_stats()
    with_reuse = [await _conversation(backend, o) for o in OPENERS]
    after = backend.prefix_stats()
    without = [await alone(o) for o in OPENERS]
    assert with_reuse == without
    # the later turns really started from the cache: most of their prompt was not re-encoded
    assert after["reused"] - before["reused"] > after["prefilled"] - before["prefilled"]
    assert no_reuse.prefix_stats()["reused"] == 0


@pytest.mark.slow
async def test_reuse_gives_the_same_greedy_tokens_with_conversations_in_flight(backend, no_reuse, alone):
    """Rows with different cached lengths (and rows with none) prefill together and join a
    running batch: left padding, positions and the mask must line up for each."""
    backend.forget_prefixes()
    before = backend.prefix_stats()["reused"]
    together = await asyncio.gather(*(_conversation(backend, o) for o in OPENERS),
                                     _conversation(backend, OPENERS[0], turns=2))
    assert backend.prefix_stats()["reused"] > before
    assert list(together) == [await alone(o) for o in OPENERS] + [await alone(OPENERS[0], turns=2)]
    # a cached row and a fresh one admitted in the same prefill
    first = await _conversation(backend, OPENERS[1], turns=1)
    history = ({"role": "system", "content": "You answer briefly."}, {"role": "user", "content": OPENERS[1]},
               {"role": "assistant", "content": first[0][1]}, {"role": "user", "content": TURNS[1]})
    fresh = ({"role": "user", "content": "Write one line about autumn leaves falling in a quiet park at dusk."},)
    reqs = [ChatRequest(messages=m, sampling=Sampling(max_tokens=8, **GREEDY)) for m in (history, fresh)]
    mixed = await asyncio.gather(*(backend.complete(r) for r in reqs))
    plain = [await no_reuse.complete(r) for r in reqs]
    assert [r.text for r in mixed] == [r.text for r in plain]


@pytest.mark.slow
async def test_prompts_admitted_together_share_their_common_head(backend, no_reuse):
    """First turns of sessions that open with the same instructions, arriving together with
    nothing cached: the shared head is prefilled once and reused by each, and the text is
    what each gives alone without reuse."""
    backend.forget_prefixes()
    before = backend.prefix_stats()
    system = {"role": "system", "content": "You are a careful quiz master. Ask one short question about the "
                                           "topic the user names, then stop. Never answer it yourself."}
    reqs = [ChatRequest(messages=(system, {"role": "user", "content": topic}), sampling=Sampling(max_tokens=12, **GREEDY))
            for topic in ("volcanoes", "the history of paper money", "owls", "tides")]
    together = await asyncio.gather(*(backend.complete(r) for r in reqs))
    after = backend.prefix_stats()
    assert after["reused"] > before["reused"]  # nothing was cached before: the head was shared in flight
    assert after["prefilled"] - before["prefilled"] < sum(r.tokens_in for r in together)
    alone = [await no_reuse.complete(r) for r in reqs]
    assert [r.text for r in together] == [r.text for r in alone]


@pytest.mark.slow
async def test_a_request_can_opt_out_of_reuse(backend):
    await _conversation(backend, OPENERS[2], turns=1)
    before = backend.prefix_stats()
    await _conversation(backend, OPENERS[2], turns=2, prefix_cache=False)
    after = backend.prefix_stats()
    assert after["reused"] == before["reused"] and after["prefilled"] > before["prefilled"]


@pytest.mark.slow
async def test_a_weight_update_invalidates_the_cache(tiny_model):
    """The cache's bookkeeping, on the tiny model: what is checked is that no key/value of
    the old weights is reused, not a real model's text."""
    import torch

    b = HFBackend(str(tiny_model), max_batch=4)
    b.load()
    try:
        await _conversation(b, OPENERS[0], turns=1)
        assert b.prefix_stats()["entries"] == 1
        # an optimizer-style in-place update, announced as the local trainer announces its
        # writes between steps (TrainedPolicy._weights_written: the backend cannot see them)
        with torch.no_grad():
            b._model.model.norm.weight.mul_(1.5)
        version = b.weights_version
        b.weights_changed()
        assert b.weights_version == version + 1 and b.prefix_stats()["entries"] == 0
        reused = b.prefix_stats()["reused"]
        await _conversation(b, OPENERS[0], turns=1)  # the very prompt whose keys/values were cached
        assert b.prefix_stats()["reused"] == reused  # prefilled in full under the new weights
        changed = await _conversation(b, OPENERS[0], turns=2)
        # the same conversation on a fresh backend with the same weights, no cache at all
        fresh = HFBackend(str(tiny_model), max_batch=4, prefix_cache=False)
        fresh.adopt(b._model, b._tokenizer)
        try:
            assert changed == await _conversation(fresh, OPENERS[0], turns=2)
        finally:
            await fresh.aclose()
        # adopting weights empties it too
        assert b.prefix_stats()["entries"] >= 1
        b.adopt(b._model, b._tokenizer)
        assert b.prefix_stats()["entries"] == 0
    finally:
        await b.aclose()
    assert b.prefix_stats()["entries"] == 0  # dropped on close


@pytest.mark.slow
async def test_the_cache_is_bounded(tiny_model):
    """Both bounds, entries and bytes, on the tiny model (its keys/values are 64 bytes a
    token: 1 layer, 1 key/value head of 8 floats, keys and values)."""
    b = HFBackend(str(tiny_model), max_batch=4, prefix_cache_entries=2)
    b.load()
    try:
        for opener in OPENERS:
            await _conversation(b, opener, turns=1)
        assert b.prefix_stats()["entries"] == 2 and b.prefix_stats()["evictions"] == 1
    finally:
        await b.aclose()
    tiny = HFBackend(str(tiny_model), max_batch=4, prefix_cache_mb=0.001)  # 1 KB: less than one entry (a prompt is > 16 tokens)
    tiny.load()
    try:
        await _conversation(tiny, OPENERS[0], turns=1)
        assert tiny.prefix_stats()["entries"] == 0 and tiny.prefix_stats()["bytes"] == 0
    finally:
        await tiny.aclose()


def test_prefix_cache_is_a_spec_model_setting(tmp_path):
    """`prefix_cache = false` on a spec's hf model reaches the backend; a non-boolean is a
    clear error, not a silently truthy string."""
    from askspec.lang.compiler import compile_source
    from askspec.runtime.backends.base import SpecContext
    from askspec.runtime.backends.registry import backend_for_spec

    text = ('experiment e { param n: int = 1 }\n'
            'model m = hf("smollm2-135m-instruct") { prefix_cache = false; max_batch = 3 }\n'
            'role r { model = m; memory = full; prompt = "Hi." }\n'
            'game g for i in range(0, n) { x = ask r }\n')
    res = compile_source(str(tmp_path / "e.ask"), text)
    assert res.ok, res.sink
    model = next(m for m in res.ir.models if m.name == "m")
    assert model.options["prefix_cache"] is False
    backend = backend_for_spec("hf", model.weights, model.options, SpecContext(spec_dir=str(tmp_path)))
    assert backend.prefix_cache is False and backend._prefixes is None
    assert HFBackend(max_batch=3)._prefixes is not None  # on by default
    with pytest.raises(BackendError, match="prefix_cache must be true or false"):
        HFBackend(prefix_cache="no")


def test_prefill_groups_keep_long_prompts_apart_and_short_ones_together():
    from askspec.runtime.backends.hf import _prefill_groups

    assert _prefill_groups([], 512) == []
    assert _prefill_groups([20] * 8, 512) == [list(range(8))]  # 8 x 20 padded tokens: one pass
    assert _prefill_groups([400, 30, 450, 20], 512) == [[3, 1], [0], [2]]  # by length; long ones alone
    assert _prefill_groups([100, 200, 300], 512) == [[0, 1], [2]]  # 2 x 200 fits, 3 x 300 does not
    assert _prefill_groups([400, 30, 450], None) == [[1, 0, 2]]  # no budget (GPU): one pass
