"""Counting a chat prompt's tokens for a role's `max_prompt_tokens` (docs/language.md,
"Prompt-length caps"), and cutting a message's text by tokens.

A backend with a tokenizer (hf, vllm, the OpenRLHF agent's trained role) counts the prompt
as it will send it: the chat template applied with the generation prompt, as its own
calls encode it. Backends without one (openai, python, replay) use `CharEstimate`: a
token per CHARS_PER_TOKEN characters of text, plus MESSAGE_OVERHEAD tokens for each
message's role markers."""

from __future__ import annotations

import math
from typing import Any, Iterable, Protocol

CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text under BPE tokenizers
MESSAGE_OVERHEAD = 4  # a chat template's role header and end-of-turn markers, per message


class PromptTokenizer(Protocol):
    def chat_length(self, messages: list[dict[str, str]]) -> int:
        """The prompt's tokens as the backend sends `messages` (generation prompt included)."""

    def encode(self, text: str) -> list[Any]:
        """`text` as tokens (no special tokens added): what `decode` turns back into text."""

    def decode(self, tokens: list[Any]) -> str:
        ...


class CharEstimate:
    """The fallback: a token is CHARS_PER_TOKEN characters (rounded up per message)."""

    def chat_length(self, messages: list[dict[str, str]]) -> int:
        return sum(math.ceil(len(m.get("content") or "") / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD for m in messages)

    def encode(self, text: str) -> list[Any]:
        return [text[i:i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]

    def decode(self, tokens: list[Any]) -> str:
        return "".join(tokens)


CHAR_ESTIMATE = CharEstimate()


class HFChatTokens:
    """A Hugging Face tokenizer's count. `render_first`: the chat template is rendered to
    text and that text encoded without special tokens (as the vllm backend and the
    OpenRLHF agent encode a prompt); otherwise the template tokenizes (as the hf backend)."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None, render_first: bool = False) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.render_first = render_first

    def chat_ids(self, messages: Iterable[dict[str, str]]) -> list[int]:
        """The prompt's token ids, as the backend sends them (the one place both count)."""
        kwargs: dict[str, Any] = {"add_generation_prompt": True}
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        if self.render_first:
            # the template already holds any BOS token; the tokenizer must not add another
            text = self.tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, **kwargs)
            return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]
        encoded = self.tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=True, **kwargs)
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        if ids and isinstance(ids[0], list):  # a batch of one
            ids = ids[0]
        return [int(i) for i in ids]

    def chat_length(self, messages: list[dict[str, str]]) -> int:
        return len(self.chat_ids(messages))

    def encode(self, text: str) -> list[Any]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, tokens: list[Any]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=False))
