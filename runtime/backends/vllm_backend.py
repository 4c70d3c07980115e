"""In-process vLLM engine (GPU machines; the PyPI vllm wheel is CUDA-only).

vLLM is imported inside the constructor, so this module imports anywhere. The engine
batches concurrent requests itself (continuous batching); every request carries its own
SamplingParams, seed included (vLLM gives each seeded request its own generator).
Written against vllm 0.29 (`AsyncLLMEngine` is the v1 `AsyncLLM`).
"""

from __future__ import annotations

import inspect
import itertools
import time
from typing import Any

from askspec.runtime.backends.base import Backend, BackendError, ChatRequest, ChatResult, FinishReason, Sampling
from askspec.runtime.backends.prompt_tokens import HFChatTokens, PromptTokenizer

MISSING_EXTRA = (
    "the vllm backend needs the 'vllm' extra: pip install 'askspec[vllm]' (CUDA GPU required)"
)


def sampling_params_kwargs(sampling: Sampling) -> dict[str, Any]:
    """Map our Sampling onto `vllm.SamplingParams` keyword arguments (pure; no vllm needed).

    Fields left as None keep vLLM's defaults. `temperature=0` is greedy in vLLM too.
    """
    kwargs: dict[str, Any] = {"n": 1, "temperature": 1.0, **sampling.given()}
    if "top_k" in kwargs:  # vLLM disables top-k with 0 or -1; ours uses None/0 for "off"
        kwargs["top_k"] = max(kwargs["top_k"], 0)
    if "stop" in kwargs:
        kwargs["include_stop_str_in_output"] = False  # stop strings are stripped, as in hf
    return kwargs


def _finish_reason(value: str | None) -> FinishReason:
    if value == "length":
        return "length"
    if value == "abort":
        return "error"
    return "stop"


class VLLMBackend(Backend):
    """`vllm.AsyncLLMEngine` in this process.

    Options (passed to `vllm.AsyncEngineArgs`):
      tensor_parallel_size, gpu_memory_utilization, max_model_len, dtype, seed,
      enforce_eager, trust_remote_code; engine_args: a dict of any further AsyncEngineArgs
      fields.
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        dtype: str = "auto",
        seed: int = 0,
        enforce_eager: bool = False,
        trust_remote_code: bool = False,
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        try:
            import vllm
            from vllm.sampling_params import RequestOutputKind
        except ImportError as exc:
            raise BackendError(MISSING_EXTRA) from exc
        except Exception as exc:  # installed but broken (e.g. a CUDA/torch mismatch)
            raise BackendError(f"vllm is installed but failed to import: {type(exc).__name__}: {exc}") from exc
        self._vllm = vllm
        self._final_only = RequestOutputKind.FINAL_ONLY
        self.model = model
        args: dict[str, Any] = {
            "model": model,
            "tensor_parallel_size": int(tensor_parallel_size),
            "gpu_memory_utilization": float(gpu_memory_utilization),
            "dtype": dtype,
            "seed": int(seed),
            "enforce_eager": bool(enforce_eager),
            "trust_remote_code": bool(trust_remote_code),
        }
        if max_model_len is not None:
            args["max_model_len"] = int(max_model_len)
        args.update(engine_args or {})
        try:
            self.engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**args))
        except Exception as exc:
            raise BackendError(f"vllm could not start an engine for {model!r}: {type(exc).__name__}: {exc}") from exc
        self._tokenizer: Any = None
        self._ids = itertools.count()

    async def _get_tokenizer(self) -> Any:
        if self._tokenizer is None:
            tokenizer = self.engine.get_tokenizer()
            if inspect.isawaitable(tokenizer):  # older vLLM made this a coroutine
                tokenizer = await tokenizer
            self._tokenizer = tokenizer
        return self._tokenizer

    async def prompt_tokenizer(self, model: str) -> PromptTokenizer:
        """The engine's tokenizer, the template rendered and then encoded as `complete` does."""
        return HFChatTokens(await self._get_tokenizer(), render_first=True)

    async def complete(self, request: ChatRequest) -> ChatResult:
        started = time.perf_counter()
        tokenizer = await self._get_tokenizer()
        try:  # as prompt_tokenizer counts it (a role's max_prompt_tokens)
            prompt_ids = HFChatTokens(tokenizer, render_first=True).chat_ids(request.messages)
        except Exception as exc:
            raise BackendError(f"vllm ({self.model}): the chat template failed: {exc}") from exc
        params = self._vllm.SamplingParams(
            **sampling_params_kwargs(request.sampling), output_kind=self._final_only
        )
        request_id = f"askspec-{request.session_index}-{request.role}-{request.call_index}-{next(self._ids)}"
        final = None
        try:
            async for output in self.engine.generate(
                {"prompt_token_ids": prompt_ids}, params, request_id
            ):
                final = output
        except Exception as exc:
            raise BackendError(f"vllm ({self.model}) generation failed: {type(exc).__name__}: {exc}") from exc
        if final is None or not final.outputs:
            raise BackendError(f"vllm ({self.model}) returned no output for request {request_id}")
        out = final.outputs[0]
        return ChatResult(
            text=out.text,
            finish_reason=_finish_reason(out.finish_reason),
            tokens_in=len(prompt_ids),
            tokens_out=len(out.token_ids),
            latency_ms=(time.perf_counter() - started) * 1000.0,
        )

    async def aclose(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()
