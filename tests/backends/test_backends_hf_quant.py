"""`quantize = "int8"` on the hf backend (hf_quant), on the real SmolLM2-135M-Instruct
weights (slow: loads the model twice), and the spec setting that asks for it."""

from __future__ import annotations

import asyncio

import pytest

from askspec.runtime.backends.base import BackendError, ChatRequest, Sampling
from askspec.runtime.backends.hf import HFBackend

GREEDY = dict(temperature=0.0)
TURNS = ["Tell me a short fact about the moon.", "Why is that?", "Say it again in one sentence."]
OPENERS = ["Tell me a short fact about the moon.", "Name three rivers in Europe and one thing about each.",
           "What is a prime number? Give two examples, then explain why 1 is not prime."]


async def _conversation(backend: HFBackend, opener: str, turns: int = 3) -> list[tuple[int, str]]:
    """A `memory = full` role's calls: each prompt is the history so far plus a new user turn."""
    history: list[dict[str, str]] = []
    out = []
    for user in [opener, *TURNS[1:turns]]:
        messages = ({"role": "system", "content": "You answer briefly."}, *history, {"role": "user", "content": user})
        r = await backend.complete(ChatRequest(messages=messages, sampling=Sampling(max_tokens=16, **GREEDY),
                                               role="solver"))
        out.append((r.tokens_out, r.text))
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": r.text}]
    return out


@pytest.fixture(scope="module")
def int8():
    b = HFBackend("smollm2-135m-instruct", max_batch=8, quantize="int8")
    b.load()
    yield b
    asyncio.run(b.aclose())


@pytest.fixture(scope="module")
def int8_no_reuse():
    b = HFBackend("smollm2-135m-instruct", max_batch=8, quantize="int8", prefix_cache=False)
    b.load()
    yield b
    asyncio.run(b.aclose())


def test_bad_quantize_is_clear():
    with pytest.raises(BackendError, match="quantize must be one of none, int8"):
        HFBackend(quantize="int4")


@pytest.mark.slow
def test_int8_linears_and_logits_close_to_float32(int8):
    """Every linear layer is quantised (lm head included), and next-token logits stay close
    to float32's: on a 300-token text, the top-1 token agrees at >= 90% of the positions
    (measured: 97.7%; torch's dynamic int8, which quantises activations too, gives 83% here
    and fails; int8 moves near-ties, which is why it is opt-in), and where they
    disagree float32's pick is still in int8's top 5."""
    import torch

    from askspec.runtime.backends.hf_quant import quantize_linears  # noqa: F401 (the module under test)

    model = int8._model
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert type(model.lm_head).__name__ == "Int8Linear" and model.lm_head.qweight.dtype == torch.int8
    full = HFBackend("smollm2-135m-instruct", prefix_cache=False)
    full.load()
    try:
        text = " ".join(["The lighthouse on the northern cape was built in 1871 from granite quarried on the island. "
                         "Its keepers carried paraffin up one hundred and twelve steps every evening, and logged "
                         "the height of every winter wave against marks painted on the tower."] * 5)
        ids = torch.tensor([full._tokenizer(text)["input_ids"][:300]])
        with torch.inference_mode():
            a = full._model(input_ids=ids).logits[0]
            b = model(input_ids=ids).logits[0]
        agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        assert agree >= 0.90, agree
        top5 = b.topk(5, dim=-1).indices
        assert bool((top5 == a.argmax(-1)[:, None]).any(-1).all())
    finally:
        asyncio.run(full.aclose())


@pytest.mark.slow
async def test_int8_reuse_gives_the_same_greedy_tokens(int8, int8_no_reuse):
    """Quantised with KV reuse == quantised without, one conversation at a time and with
    conversations in flight together."""
    int8.forget_prefixes()
    before = int8.prefix_stats()
    with_reuse = [await _conversation(int8, o) for o in OPENERS]
    assert int8.prefix_stats()["reused"] > before["reused"]
    without = [await _conversation(int8_no_reuse, o) for o in OPENERS]
    assert with_reuse == without
    int8.forget_prefixes()
    together = await asyncio.gather(*(_conversation(int8, o) for o in OPENERS))
    assert list(together) == without


def test_quantize_is_a_spec_model_setting(tmp_path):
    """`quantize = "int8"` reaches the backend and the run manifest's determinism record;
    "none" is the default backend; a bad value or a non-hf model is E107; a trained role's
    model gets W504 (training keeps its weights in full precision)."""
    from askspec.lang.compiler import compile_source
    from askspec.runtime.backends.base import SpecContext
    from askspec.runtime.backends.registry import backend_for_spec

    def compile_(model_line: str, role_flags: str = ""):
        text = ('experiment e { param n: int = 1 }\n'
                f'{model_line}\n'
                f'role r {{ model = m; memory = full; prompt = "Hi." {role_flags}}}\n'
                'game g for i in range(0, n) { x = ask r }\n')
        return compile_source(str(tmp_path / "e.ask"), text)

    res = compile_('model m = hf("smollm2-135m-instruct") { quantize = "int8" }')
    assert res.ok and not any(d.code == "W504" for d in res.sink.items), res.sink
    model = next(m for m in res.ir.models if m.name == "m")
    backend = backend_for_spec("hf", model.weights, model.options, SpecContext(spec_dir=str(tmp_path)))
    assert isinstance(backend, HFBackend) and backend.quantize == "int8"
    assert backend.determinism(1)["quantize"] == "int8"
    none = compile_('model m = hf("smollm2-135m-instruct") { quantize = "none" }')
    m = next(m for m in none.ir.models if m.name == "m")
    assert HFBackend.spec_options(m.weights, m.options, SpecContext()) == {}  # shares the default backend

    bad = compile_('model m = hf("smollm2-135m-instruct") { quantize = "int4" }')
    assert [d.code for d in bad.sink.items if d.severity == "error"] == ["E107"]
    other = compile_('model m = openai("x", base_url = "http://h/v1") { quantize = "int8" }')
    assert [d.code for d in other.sink.items if d.severity == "error"] == ["E107"]
    trained = compile_('model m = hf("smollm2-135m-instruct") { quantize = "int8" }', "; trained")
    assert "W504" in [d.code for d in trained.sink.items]
