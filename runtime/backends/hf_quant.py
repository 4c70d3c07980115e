"""Reduced-precision serving for the hf backend: the `quantize` model setting.

`quantize = "int8"`: weight-only int8. Every `nn.Linear` (attention and MLP projections,
and the lm head, which SmolLM2 ties to the input embeddings: the embedding table stays
float32) becomes an `Int8Linear`: int8 weights with one float scale per output channel
(symmetric, absmax / 127), multiplied by bfloat16 activations in torch's
`_weight_int8pack_mm` kernel (fp32 accumulation), output back in float32. The rest of the
model (norms, rotary embeddings, attention, the KV cache) stays float32.

Why this and not torch's dynamic quantisation (`quantize_dynamic`, int8 activations
too): on CPU a decode step is bound by reading the weights, so int8 weights are what
speed it up, and SmolLM2's activations have outlier channels that per-tensor int8
activations cannot hold: measured on 600-token texts, dynamic int8 agreed with float32's
top-1 token at 38-49% of positions (KL 0.95-1.26), weight-only int8 at 94% (KL 0.006),
bfloat16 weights at 95-96%. Decode: ~2x faster than float32 at batch 1 and 8 (docs/
benchmarks.md). Logits move (near-ties flip), so it is opt-in and never applied to
weights the trainer updates (they would go stale in a quantised copy).

`quantize = "fp16"`: every `nn.Linear` becomes an `Fp16Linear`: float16 weights packed for
FBGEMM's fp16 GEMM (`torch.fbgemm_linear_fp16_weight_fp32_activation`), activations and
accumulation in float32. Half float32's bytes per weight (int8 reads a quarter), but a real
GEMM: the weights are read once for all the rows of a pass, where `_weight_int8pack_mm`
costs about the same per row at 8 rows as at 1 and is 2x slower than float32 at hundreds
(prefill). Measured on SmolLM2-135M (docs/benchmarks.md): decode at batch 1 as fast as
int8 or faster, at batch 8 and in prefill about 2x int8; top-1 token agreement with
float32 100% on a 300-token text. Its output rows do not depend on the batch (bit-equal
at 1, 7 or 300 rows), so a reply's cached keys/values match a re-encoding's, as float32's
GEMM (oneDNN's or MKL's, see cpu_linear) does not promise. torch marks these two functions deprecated in its Python API;
a torch without them (or without FBGEMM: non-x86) gets a clear error.
"""

from __future__ import annotations

from typing import Any

from askspec.runtime.backends.base import BackendError

QUANTIZE = ("none", "int8", "fp16")


def _int8_linear_class() -> Any:
    import torch

    class Int8Linear(torch.nn.Module):
        """y = x @ W.T + b with W held as int8 [out, in] and per-row scales (bfloat16)."""

        def __init__(self, linear: torch.nn.Linear) -> None:
            super().__init__()
            w = linear.weight.detach().float()
            scale = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self.qweight: torch.Tensor
            self.scale: torch.Tensor
            self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
            self.register_buffer("scale", scale.to(torch.bfloat16))
            self.bias = linear.bias

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            flat = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
            y = torch._weight_int8pack_mm(flat, self.qweight, self.scale).to(x.dtype)
            if self.bias is not None:
                y = y + self.bias
            return y.reshape(*x.shape[:-1], self.out_features)

    return Int8Linear


def _fp16_deprecation_seen(torch: Any) -> None:
    """Have torch give its deprecation notice for both FBGEMM functions now, unseen.

    torch marks them deprecated in its Python API and warns once per process (a C++
    warn-once flag), not per call; they are what serves fp16 here, so that notice is not
    the user's to see. One tiny call of each, with the notice ignored only inside the
    block (the process's warnings filters are left as they were), uses it up: no forward
    pays for a filter, and none warns."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"fbgemm_(pack_gemm_matrix_fp16|linear_fp16_weight_fp32_activation) "
                                r"is deprecated", category=UserWarning)
        packed = torch.fbgemm_pack_gemm_matrix_fp16(torch.zeros(1, 1))
        torch.fbgemm_linear_fp16_weight_fp32_activation(torch.zeros(1, 1), packed, torch.zeros(1))


def _fp16_linear_class() -> Any:
    import torch

    _fp16_deprecation_seen(torch)

    class Fp16Linear(torch.nn.Module):
        """y = x @ W.T + b with W held as float16, packed for FBGEMM's fp16 GEMM, and x, y
        and the accumulation in float32."""

        def __init__(self, linear: torch.nn.Linear) -> None:
            super().__init__()
            self.in_features, self.out_features = linear.in_features, linear.out_features
            w = linear.weight.detach().float()
            self.packed = torch.fbgemm_pack_gemm_matrix_fp16(w.contiguous())
            self.bias_f32: torch.Tensor
            self.register_buffer("bias_f32", linear.bias.detach().float() if linear.bias is not None
                                 else torch.zeros(self.out_features))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            flat = x.reshape(-1, self.in_features).float().contiguous()
            y = torch.fbgemm_linear_fp16_weight_fp32_activation(flat, self.packed, self.bias_f32)
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    return Fp16Linear


def quantize_linears(model: Any, mode: str, device: Any) -> Any:
    """`model` with every nn.Linear replaced by its `mode` version, in place (returned)."""
    import torch

    if mode not in QUANTIZE:
        raise BackendError(f"hf backend: quantize must be one of {', '.join(QUANTIZE)}, got {mode!r}")
    if mode == "none":
        return model
    if device.type != "cpu":
        raise BackendError(f"hf backend: quantize = {mode!r} runs on the cpu device only (this model is on {device})")
    if mode == "int8":
        if not hasattr(torch, "_weight_int8pack_mm"):
            raise BackendError(f"hf backend: quantize = {mode!r} needs torch's _weight_int8pack_mm (torch >= 2.3)")
        make = _int8_linear_class()
    else:
        if not (hasattr(torch, "fbgemm_linear_fp16_weight_fp32_activation")
                and "fbgemm" in torch.backends.quantized.supported_engines):
            raise BackendError(f"hf backend: quantize = {mode!r} needs a torch built with FBGEMM (x86)")
        make = _fp16_linear_class()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, make(child))
    return model
