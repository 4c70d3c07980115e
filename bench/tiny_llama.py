"""A tiny random Llama with SmolLM2's tokenizer (the converted GGUF), saved as a
transformers folder a spec can name with `hf("<folder>")`: what the training benchmarks
time an update or a step on (bench_skip_step.py, bench_async_rollouts.py). The test
suite's own fixture is tests/conftest.py's `tiny_model`."""

from __future__ import annotations

from pathlib import Path


def build_tiny_llama(folder: Path, hidden: int, layers: int) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from askspec.runtime.backends.hf import resolve_weights

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(resolve_weights("smollm2-135m-instruct")))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192, eos_token_id=2,
                      bos_token_id=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
