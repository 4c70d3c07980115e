"""A tiny random Llama and a word-level tokenizer built from a config in a few
milliseconds (no downloaded weights, no SmolLM2): for tests of the update step,
checkpoints and model loading that need a real transformers folder, not a good model."""

from __future__ import annotations

from pathlib import Path

WORDS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system",
         *"abcdefghijklmnopqrstuvwxyz", *"0123456789", "+", "=", "?", "."]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def build_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Save a 1-layer Llama (hidden size 16) and its tokenizer to `folder`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="<|im_end|>",
                                  pad_token="</s>")
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      eos_token_id=WORDS.index("<|im_end|>"), bos_token_id=1, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder
