"""`quantize = "int8"` and `"fp16"` on the hf backend (hf_quant), on the real
SmolLM2-135M-Instruct weights (slow: loads and quantises the model once per mode, and once
in float32 for the logits the modes are compared with), and the spec setting that asks for
them."""

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
    """A `memory = full` role's calls: each prompt is the history so far plus a new user turn.
    Replies are 8 tokens: the quantised decode step is the cost here, and each later turn's
    prompt still holds the earlier replies (the keys/values that are reused)."""
    history: list[dict[str, str]] = []
    out = []
    for user in [opener, *TURNS[1:turns]]:
        messages = ({"role": "system", "content": "You answer briefly."}, *history, {"role": "user", "content": user})
        r = await backend.complete(ChatRequest(messages=messages, sampling=Sampling(max_tokens=8, **GREEDY),
                                               role="solver"))
        out.append((r.tokens_out, r.text))
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": r.text}]
    return out


@pytest.fixture(scope="module")
def served():
    """`served(mode, reuse=True)`: an hf backend serving SmolLM2 with that quantize setting
    (and prefix cache on or off), made once per module. A mode's backend without reuse
    serves the very model (quantised weights) of its backend with reuse (`adopt`): one
    load and quantisation per mode."""
    made: dict[tuple[str, bool], HFBackend] = {}

    def get(mode: str, reuse: bool = True) -> HFBackend:
        if (mode, reuse) not in made:
            if reuse:
                made[(mode, reuse)] = HFBackend("smollm2-135m-instruct", max_batch=8, quantize=mode)
                made[(mode, reuse)].load()
            else:
                loaded = get(mode)
                made[(mode, reuse)] = HFBackend("smollm2-135m-instruct", max_batch=8, prefix_cache=False)
                made[(mode, reuse)].adopt(loaded._model, loaded._tokenizer)
        return made[(mode, reuse)]

    yield get
    for backend in made.values():
        asyncio.run(backend.aclose())


def test_bad_quantize_is_clear():
    with pytest.raises(BackendError, match="quantize must be one of none, int8, fp16"):
        HFBackend(quantize="int4")


def test_fp16_linear_rows_do_not_depend_on_their_batch():
    """The fp16 layer's output row is the same bits whatever else is in the pass (one row,
    a few, hundreds): the property that lets a reply's cached keys/values, computed one
    decode step at a time, equal a re-encoding's. And it stays close to float32."""
    import torch

    from askspec.runtime.backends.hf_quant import _fp16_linear_class

    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 80)
    layer = _fp16_linear_class()(linear)
    x = torch.randn(300, 96)
    whole = layer(x)
    assert torch.equal(whole, torch.cat([layer(x[i:i + 1]) for i in range(300)]))
    assert torch.equal(whole, torch.cat([layer(x[i:i + 7]) for i in range(0, 300, 7)]))
    assert torch.equal(layer(x.reshape(3, 100, 96)).reshape(300, 80), whole)
    with torch.no_grad():
        exact = linear(x)
    assert (whole - exact).abs().max().item() < 2e-3 * exact.abs().max().item()
    assert whole.dtype == torch.float32 and layer.packed is not None


@pytest.fixture(scope="module")
def beside_float32(served):
    """`beside_float32(model)`: next-token logits of float32 SmolLM2 and of `model` at every
    position of a 300-token text: (float32's, model's). float32's are computed once a module
    (on the unquantised backend)."""
    import torch

    reference: list = []

    def get(model):
        if not reference:
            full = served("none")
            text = " ".join(["The lighthouse on the northern cape was built in 1871 from granite quarried on the "
                             "island. Its keepers carried paraffin up one hundred and twelve steps every evening, "
                             "and logged the height of every winter wave against marks painted on the tower."] * 5)
            ids = torch.tensor([full._tokenizer(text)["input_ids"][:300]])
            with torch.inference_mode():
                reference.append((ids, full._model(input_ids=ids).logits[0]))
        ids, logits = reference[0]
        with torch.inference_mode():
            return logits, model(input_ids=ids).logits[0]

    return get


@pytest.mark.slow
def test_fp16_logits_match_float32(served, beside_float32):
    """float16 weights with float32 activations: on a 300-token text the top-1 token
    agrees with float32's at >= 99% of the positions (measured: 100%) and no logit moves
    by more than a small fraction of its range."""
    import torch

    model = served("fp16")._model
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert type(model.lm_head).__name__ == "Fp16Linear"
    a, b = beside_float32(model)
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree >= 0.99, agree
    assert (a - b).abs().max().item() < 0.05 * (a.max() - a.min()).item()


@pytest.mark.slow
def test_int8_linears_and_logits_close_to_float32(served, beside_float32):
    """Every linear layer is quantised (lm head included), and next-token logits stay close
    to float32's: on a 300-token text, the top-1 token agrees at >= 90% of the positions
    (measured: 97.7%; torch's dynamic int8, which quantises activations too, gives 83% here
    and fails; int8 moves near-ties, which is why it is opt-in), and where they
    disagree float32's pick is still in int8's top 5."""
    import torch

    model = served("int8")._model
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert type(model.lm_head).__name__ == "Int8Linear" and model.lm_head.qweight.dtype == torch.int8
    a, b = beside_float32(model)
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree >= 0.90, agree
    top5 = b.topk(5, dim=-1).indices
    assert bool((top5 == a.argmax(-1)[:, None]).any(-1).all())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "fp16"])
async def test_reuse_gives_the_same_greedy_tokens(mode, served):
    """Quantised with KV reuse == quantised without, one conversation at a time and with
    conversations in flight together."""
    reuse, no_reuse = served(mode), served(mode, reuse=False)
    reuse.forget_prefixes()
    before = reuse.prefix_stats()
    with_reuse = [await _conversation(reuse, o) for o in OPENERS]
    assert reuse.prefix_stats()["reused"] > before["reused"]
    without = [await _conversation(no_reuse, o) for o in OPENERS]
    assert with_reuse == without
    reuse.forget_prefixes()
    together = await asyncio.gather(*(_conversation(reuse, o) for o in OPENERS))
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

    half = compile_('model m = hf("smollm2-135m-instruct") { quantize = "fp16" }')
    assert half.ok, half.sink
    hm = next(m for m in half.ir.models if m.name == "m")
    hb = backend_for_spec("hf", hm.weights, hm.options, SpecContext(spec_dir=str(tmp_path)))
    assert isinstance(hb, HFBackend) and hb.quantize == "fp16" and hb.determinism(8)["quantize"] == "fp16"
    bad = compile_('model m = hf("smollm2-135m-instruct") { quantize = "int4" }')
    assert [d.code for d in bad.sink.items if d.severity == "error"] == ["E107"]
    other = compile_('model m = openai("x", base_url = "http://h/v1") { quantize = "int8" }')
    assert [d.code for d in other.sink.items if d.severity == "error"] == ["E107"]
    trained = compile_('model m = hf("smollm2-135m-instruct") { quantize = "int8" }', "; trained")
    assert "W504" in [d.code for d in trained.sink.items]
