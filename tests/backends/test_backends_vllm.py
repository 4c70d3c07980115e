"""vLLM backend seams that run without a GPU: the missing-extra error and the mapping of
our Sampling onto vllm.SamplingParams arguments."""

from __future__ import annotations

import importlib.util

import pytest

from askspec.runtime.backends.base import BackendError, Sampling
from askspec.runtime.backends.vllm_backend import MISSING_EXTRA, VLLMBackend, sampling_params_kwargs


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_extra_is_a_clear_error():
    with pytest.raises(BackendError) as info:
        VLLMBackend("Qwen/Qwen3-1.7B")
    assert str(info.value) == (
        "the vllm backend needs the 'vllm' extra: pip install 'askspec[vllm]' (CUDA GPU required)"
    )
    assert str(info.value) == MISSING_EXTRA


def test_defaults_leave_vllm_defaults_alone():
    assert sampling_params_kwargs(Sampling()) == {"n": 1, "max_tokens": 256, "temperature": 1.0}


def test_every_field_maps():
    kwargs = sampling_params_kwargs(
        Sampling(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=0.5,
                 repetition_penalty=1.1, max_tokens=64, stop=("</answer>", "\n\n"), seed=7)
    )
    assert kwargs == {
        "n": 1, "max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "presence_penalty": 0.5, "repetition_penalty": 1.1, "seed": 7,
        "stop": ["</answer>", "\n\n"], "include_stop_str_in_output": False,
    }


def test_greedy_and_disabled_top_k():
    kwargs = sampling_params_kwargs(Sampling(temperature=0.0, top_k=0))
    assert kwargs["temperature"] == 0.0
    assert kwargs["top_k"] == 0  # vLLM's "off"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the vllm extra")
def test_mapping_is_accepted_by_real_sampling_params():
    import vllm

    params = vllm.SamplingParams(**sampling_params_kwargs(Sampling(top_k=5, stop=("x",), seed=1)))
    assert params.top_k == 5 and params.seed == 1 and list(params.stop) == ["x"]
