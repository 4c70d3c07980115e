"""Tensor-level pieces of the hf backend, kept apart so they can be tested without a model.

- `sample_rows`: one token per batch row, each row with its own sampling parameters and
  its own `torch.Generator` (a row draws exactly one uniform number per step, whatever the
  path, so its random stream does not depend on its neighbours).
- `GrowingLayer`: a KV-cache layer that writes new columns into spare room instead of
  concatenating (transformers' DynamicLayer copies the whole cache every step).
- `gqa_sdpa_attention`: SDPA with `enable_gqa` even when a padding mask is present
  (transformers' sdpa path then repeats keys/values per query head: a 3x copy of the
  cache per layer per step for SmolLM2).
- `cache_from`: a cache pre-filled with given keys/values (a reused prompt prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

GREEDY_BELOW = 1e-5  # temperatures at or below this are greedy
CANDIDATES = 256  # top-p looks among this many best tokens first, and sorts all only if short
GROW = 64  # spare KV columns allocated beyond the current length


@dataclass(frozen=True)
class RowSampling:
    """Sampling parameters of one row, with "off" spelled as neutral values."""

    temperature: float = 1.0
    top_p: float = 1.0  # 1.0: off
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0.0: off
    presence: float = 0.0  # subtracted from logits of tokens already generated
    repetition: float = 1.0  # HF/vLLM style, over prompt + generated tokens

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_BELOW


def sample_rows(
    logits: torch.Tensor,
    params: list[RowSampling],
    generators: list[torch.Generator],
    seen_all: list[torch.Tensor | None] | None = None,
    seen_gen: list[torch.Tensor | None] | None = None,
) -> list[int]:
    """Pick one token id per row of `logits` [rows, vocab].

    Order (as in vLLM): repetition and presence penalties, temperature, min_p, top_k, top_p.
    `seen_all[i]` / `seen_gen[i]` are bool[vocab] masks of the tokens the penalties apply to
    (None when row i does not use that penalty).
    """
    logits = logits.float()
    rows, vocab = logits.shape
    dev = logits.device
    if any(p.repetition != 1.0 for p in params):
        rep = torch.tensor([p.repetition for p in params], device=dev)[:, None]
        seen = _stack_masks(seen_all, rows, vocab, dev)
        # Shrink positive logits and grow negative ones, so a penalty always lowers them.
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    if any(p.presence != 0.0 for p in params):
        pres = torch.tensor([p.presence for p in params], device=dev)[:, None]
        logits = logits - pres * _stack_masks(seen_gen, rows, vocab, dev)

    out = [0] * rows
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        for i, token in zip(greedy, logits[greedy].argmax(-1).tolist()):
            out[i] = int(token)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if not sampled:
        return out
    part = [params[i] for i in sampled]
    temps = torch.tensor([p.temperature for p in part], device=dev)[:, None]
    probs = (logits[sampled] / temps).softmax(-1)
    if any(p.min_p > 0.0 for p in part):
        min_p = torch.tensor([p.min_p for p in part], device=dev)[:, None]
        probs = probs.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0)
    picks = _draw_filtered(probs, part, [generators[i] for i in sampled])
    for i, token in zip(sampled, picks):
        out[i] = token
    return out


def token_logprobs(logits: torch.Tensor, tokens: list[int], temperatures: list[float]) -> list[float]:
    """log_softmax(logits / T)[token] per row, T = 1 for greedy rows: the sampling policy's
    log-probability of each picked token, as a trainer recomputes it (no penalties or
    top-p/top-k truncation, which are sampling-time filters)."""
    temps = torch.tensor([t if t > GREEDY_BELOW else 1.0 for t in temperatures], device=logits.device)[:, None]
    logp = (logits.float() / temps).log_softmax(-1)
    idx = torch.tensor(tokens, device=logits.device)[:, None]
    return logp.gather(-1, idx).squeeze(-1).tolist()


def _stack_masks(masks: list[torch.Tensor | None] | None, rows: int, vocab: int, dev: Any) -> torch.Tensor:
    stacked = torch.zeros((rows, vocab), dtype=torch.bool, device=dev)
    for i, mask in enumerate(masks or []):
        if mask is not None:
            stacked[i] = mask
    return stacked


def _draw_filtered(probs: torch.Tensor, params: list[RowSampling], gens: list[torch.Generator]) -> list[int]:
    """Apply top_k/top_p where asked, then draw. Avoids sorting the whole vocabulary (the
    dominant sampling cost, ~5 ms per row on CPU) unless top-p needs more than CANDIDATES."""
    rows, vocab = probs.shape
    picks = [0] * rows
    narrow = [j for j, p in enumerate(params) if p.top_k > 0 or p.top_p < 1.0]
    wide = [j for j, p in enumerate(params) if not (p.top_k > 0 or p.top_p < 1.0)]
    if wide:
        drawn = draw(probs[wide], [gens[j] for j in wide])
        for j, token in zip(wide, drawn.tolist()):
            picks[j] = int(token)
    if not narrow:
        return picks
    sub = probs[narrow]
    sub_params = [params[j] for j in narrow]
    width = min(vocab, max(p.top_k if p.top_k > 0 else CANDIDATES for p in sub_params))
    vals, idx = sub.topk(width, dim=-1)  # sorted, best first
    kept, exact = _cut(vals, sub.sum(-1), sub_params)
    for n, (j, ok) in enumerate(zip(narrow, exact.tolist())):
        if ok or width == vocab:
            pick = draw(kept[n : n + 1], [gens[j]])
            picks[j] = int(idx[n, int(pick)])
        else:  # top-p reaches beyond the candidates: sort this row in full
            full_vals, full_idx = sub[n].sort(descending=True)
            full_kept, _ = _cut(full_vals[None], sub[n].sum()[None], [params[j]])
            pick = draw(full_kept, [gens[j]])
            picks[j] = int(full_idx[int(pick)])
    return picks


def _cut(vals: torch.Tensor, total: torch.Tensor, params: list[RowSampling]) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero what top_k/top_p drop from best-first probabilities `vals` [n, width].

    `total` is each row's whole (unnormalised) mass. Returns the kept probabilities and,
    per row, whether the result is exact: true when top_k bounds the set, or when the
    candidates already hold the top_p mass.
    """
    dev = vals.device
    width = vals.shape[-1]
    ranks = torch.arange(width, device=dev)[None, :]
    has_k = torch.tensor([p.top_k > 0 for p in params], device=dev)
    ks = torch.tensor([p.top_k if p.top_k > 0 else width for p in params], device=dev)[:, None]
    vals = vals.masked_fill(ranks >= ks, 0.0)
    mass = torch.where(has_k, vals.sum(-1), total)  # top_p is relative to the top_k survivors
    top_p = torch.tensor([p.top_p if p.top_p < 1.0 else float("inf") for p in params], device=dev)
    cum = vals.cumsum(-1)
    # Drop a token when the mass before it already reaches top_p (the best one always stays).
    kept = vals.masked_fill(cum - vals > (top_p * mass)[:, None], 0.0)
    exact = has_k | (cum[:, -1] >= top_p * mass)
    return kept, exact


def draw(probs: torch.Tensor, gens: list[torch.Generator]) -> torch.Tensor:
    """Inverse-CDF sampling from unnormalised `probs` [n, m]: one uniform per row."""
    cdf = probs.cumsum(-1)
    u = torch.cat([torch.rand(1, generator=g, device=probs.device) for g in gens])
    # 1 - u lies in (0, 1], so the target is > 0 and never lands on a zero-probability
    # token at the front of the row.
    target = ((1.0 - u)[:, None] * cdf[:, -1:]).contiguous()
    return torch.searchsorted(cdf.contiguous(), target).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views into buffers with spare room at the end.

    A decode step writes its column in place; the buffer doubles when full, so appending
    is amortised O(1) instead of DynamicLayer's O(length) concatenation per step.
    """

    # DynamicLayer's state (transformers is not followed by the type check)
    is_initialized: bool
    keys: torch.Tensor | None
    values: torch.Tensor | None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.assign(key_states, value_states)
            return self.keys, self.values
        keys, values = self.keys, self.values
        assert keys is not None and values is not None  # set by the first update (assign)
        n, q = keys.shape[-2], key_states.shape[-2]
        if n + q > self._kbuf.shape[-2]:
            self.assign(keys, values, room=max(q, n, GROW))
        self._kbuf[:, :, n : n + q] = key_states
        self._vbuf[:, :, n : n + q] = value_states
        self.keys = self._kbuf[:, :, : n + q]
        self.values = self._vbuf[:, :, : n + q]
        return self.keys, self.values

    def assign(self, keys: torch.Tensor, values: torch.Tensor, room: int = GROW) -> None:
        """Replace the contents with copies of `keys`/`values`, leaving `room` spare columns."""
        b, h, n, d = keys.shape
        self._kbuf = keys.new_empty((b, h, n + room, d))
        self._vbuf = values.new_empty((b, h, n + room, values.shape[-1]))
        self._kbuf[:, :, :n] = keys
        self._vbuf[:, :, :n] = values
        self.keys = self._kbuf[:, :, :n]
        self.values = self._vbuf[:, :, :n]
        self.is_initialized = True

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            assert self.keys is not None and self.values is not None  # a layer with a length holds them
            self.assign(self.keys[indices], self.values[indices])


def new_cache() -> Any:
    """An empty DynamicCache whose layers are GrowingLayers."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer  # layers are created on first update
    return cache


ATTENTION_NAME = "askspec_gqa_sdpa"


def gqa_sdpa_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0,
                       scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any):
    """transformers' SDPA attention, but grouped-query heads share keys/values in-kernel."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = q_len > 1 and attention_mask is None and (
        is_causal if is_causal is not None else getattr(module, "is_causal", True)
    )
    if groups <= 1 or kwargs.get("position_bias") is not None or (causal and kv_len != q_len):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=causal, enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def use_gqa_attention(model: Any) -> bool:
    """Switch an sdpa model to gqa_sdpa_attention; returns whether it did."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(ATTENTION_NAME, gqa_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return True


def cache_from(keys: list[torch.Tensor], values: list[torch.Tensor]) -> Any:
    """A cache like new_cache()'s, holding the given per-layer keys/values [B, heads, T, dim]."""
    cache = new_cache()
    for k, v in zip(keys, values):
        layer = GrowingLayer()
        layer.lazy_initialization(k, v)
        layer.assign(k, v)
        cache.layers.append(layer)
    return cache
