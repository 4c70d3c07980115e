"""cpu_linear: float32 linear layers through oneDNN give nn.Linear's outputs and gradients,
are switched on where they apply (the hf backend's models, the trainer's policy and its
reference) and nowhere else."""

from __future__ import annotations

import pytest
import torch

from askspec.runtime.backends import cpu_linear
from askspec.runtime.backends.cpu_linear import OneDNNLinear, use_onednn_linears, use_torch_linears

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="this torch has no oneDNN linear")


def _pair(bias: bool, n_in: int = 48, n_out: int = 80) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    stock = torch.nn.Linear(n_in, n_out, bias=bias)
    switched = torch.nn.Linear(n_in, n_out, bias=bias)
    switched.load_state_dict(stock.state_dict())
    assert use_onednn_linears(switched) == 1 and isinstance(switched, OneDNNLinear)
    return stock, switched


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 48), (3, 7, 48), (2, 1, 48)])
def test_outputs_and_gradients_equal_nn_linear(bias, shape):
    stock, switched = _pair(bias)
    x = torch.randn(*shape)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = stock(xa), switched(xb)
    torch.testing.assert_close(yb, ya, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(ya)
    ya.backward(grad)
    yb.backward(grad)
    assert yb.grad_fn is not None and "OneDNN" in type(yb.grad_fn).__name__  # its own backward ran
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(switched.weight.grad, stock.weight.grad, rtol=1e-5, atol=1e-5)
    if bias:
        torch.testing.assert_close(switched.bias.grad, stock.bias.grad, rtol=1e-5, atol=1e-5)


def test_strided_input_and_weight_only_gradient():
    stock, switched = _pair(True)
    x = torch.randn(48, 6).t()  # not contiguous, and no gradient of its own
    stock(x).square().sum().backward()
    switched(x).square().sum().backward()
    torch.testing.assert_close(switched.weight.grad, stock.weight.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(switched.bias.grad, stock.bias.grad, rtol=1e-5, atol=1e-4)


def test_a_frozen_layer_passes_the_input_gradient_only():
    stock, switched = _pair(False)
    for p in (*stock.parameters(), *switched.parameters()):
        p.requires_grad_(False)
    xa, xb = torch.randn(4, 48, requires_grad=True), None
    xb = xa.detach().clone().requires_grad_(True)
    stock(xa).sum().backward()
    switched(xb).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-5)
    assert switched.weight.grad is None


def test_no_grad_and_empty_inputs():
    stock, switched = _pair(True)
    with torch.inference_mode():
        x = torch.randn(3, 48)
        torch.testing.assert_close(switched(x), stock(x), rtol=1e-5, atol=1e-5)
        assert switched(torch.randn(0, 48)).shape == (0, 80)


def test_autocast_and_other_dtypes_keep_torchs_path():
    stock, switched = _pair(True)
    x = torch.randn(3, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert switched(x).dtype == torch.bfloat16 == stock(x).dtype
    double = torch.nn.Linear(4, 3).double()
    half = torch.nn.Linear(4, 3).to(torch.bfloat16)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), double, half, torch.nn.Embedding(5, 4))
    assert use_onednn_linears(model) == 1  # the float32 linear only
    assert type(model[1]) is torch.nn.Linear and type(model[2]) is torch.nn.Linear
    assert use_onednn_linears(model) == 0  # idempotent
    assert use_torch_linears(model) == 1 and type(model[0]) is torch.nn.Linear


def test_the_environment_switches_it_off(monkeypatch):
    monkeypatch.setenv(cpu_linear.ENV, "torch")
    assert not cpu_linear.available()
    assert use_onednn_linears(torch.nn.Linear(3, 3)) == 0


def test_served_and_trained_models_use_it(tiny_model, tmp_path):
    from askspec.ir import model as ir
    from askspec.lang.training import lower_training
    from askspec.runtime.backends.hf import HFBackend
    from askspec.runtime.train.config import config_from_ir
    from askspec.runtime.train.policy import TrainedPolicy

    backend = HFBackend(str(tiny_model))
    backend.load()
    linears = [m for m in backend._model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is OneDNNLinear for m in linears)

    exp = lower_training(ir.Experiment(name="t", roles=[ir.Role(name="r", trained=True)],
                                       training=[ir.Training(role="r", algorithm="grpo")]), {"r": {"kl": 0.1}})
    policy = TrainedPolicy(config_from_ir(exp.training[0], exp), str(tiny_model), {"num_threads": 1})
    for model in (policy.model, policy.ref):
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(type(m) is OneDNNLinear for m in linears)
    policy.save(tmp_path / "ckpt", 1, {})  # a checkpoint is a stock transformers folder
    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"))
    assert all(type(m) is torch.nn.Linear for m in again.modules() if isinstance(m, torch.nn.Linear))
