"""float32 linear layers on a CPU through oneDNN instead of torch's default GEMM.

torch runs a float32 `nn.Linear` on a CPU through MKL's sgemm. On the AMD EPYC machines
askspec is built and tested on, MKL takes a code path that reaches 70-115 GFLOP/s on one
core, while oneDNN's float32 matmul (which torch ships, as `mkldnn::_linear_pointwise`)
reaches 190-270 GFLOP/s on the same shapes: 2.3-2.7x in the forward and in both products
of the backward (bench/bench_cpu_linear.py prints the two side by side). Both are IEEE
float32 with float32 accumulation; only the summation order differs (outputs agree to
~1e-6 relative), as two GEMM libraries' results always may.

`use_onednn_linears(model)` switches every float32 `nn.Linear` of a model on the CPU to
`OneDNNLinear` (the same module and parameters, a different `forward`): the hf backend does
it for the models it serves, the local trainer for the policy it trains (and its frozen KL
reference). The backward runs through oneDNN too (`_OneDNNLinearFunction`), so gradients
reach the same parameters as before. Anything else (a GPU, bfloat16 weights or autocast,
an int8/fp16 `quantize` layer, a torch built without oneDNN) keeps torch's own path.

ASKSPEC_CPU_LINEAR=torch switches it off for a process (to compare, or should a CPU's
oneDNN ever be the slower one).
"""

from __future__ import annotations

import os
from typing import Any

import torch

ENV = "ASKSPEC_CPU_LINEAR"


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) by oneDNN; x [..., in] (any strides), weight [out, in]."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinearFunction(torch.autograd.Function):
    """y = x W^T + b with all three products by oneDNN:
    dx = dy W, dW = dy^T x, db = sum dy (over every leading dimension)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _linear(flat, weight.t()).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            dw = _linear(flat.t(), x.reshape(-1, x.shape[-1]).t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = flat.sum(0)
        return dx, dw, db


class OneDNNLinear(torch.nn.Linear):
    """An `nn.Linear` whose float32 CPU products run through oneDNN (module docstring).
    Made by changing a loaded layer's class (`use_onednn_linears`), never constructed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.device.type != "cpu" or x.dtype != torch.float32 or w.dtype != torch.float32 or x.numel() == 0
                or torch.is_autocast_enabled("cpu")):
            return torch.nn.functional.linear(x, w, self.bias)
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                        or (self.bias is not None and self.bias.requires_grad)):
            return _OneDNNLinearFunction.apply(x, w, self.bias)
        return _linear(x, w, self.bias)


def available() -> bool:
    """Whether this torch has oneDNN's linear and the process has not switched it off."""
    if os.environ.get(ENV, "onednn").strip().lower() == "torch":
        return False
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def use_onednn_linears(model: torch.nn.Module) -> int:
    """Switch the model's float32 CPU `nn.Linear` layers to `OneDNNLinear` in place;
    returns how many it switched (0 where unavailable). Idempotent."""
    if not available():
        return 0
    switched = 0
    for module in model.modules():
        if (type(module) is torch.nn.Linear and module.weight.device.type == "cpu"
                and module.weight.dtype == torch.float32):
            module.__class__ = OneDNNLinear
            switched += 1
    return switched


def use_torch_linears(model: torch.nn.Module) -> int:
    """Undo `use_onednn_linears` (the benchmark's side-by-side); returns how many it switched."""
    switched = 0
    for module in model.modules():
        if type(module) is OneDNNLinear:
            module.__class__ = torch.nn.Linear  # type: ignore[assignment]  # back to the class it was
            switched += 1
    return switched
