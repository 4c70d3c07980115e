"""The backend contract: one chat request in, one result out.

The engine sends each model call as a `ChatRequest` to `Backend.complete`. Backends
that batch (hf, vllm) gather concurrent `complete` calls into batches internally, so the
engine only has to keep many sessions in flight. Every backend reports token counts,
a finish reason and latency so the run store can record them; a backend that generates
token by token also reports each new token while it works (`ChatRequest.on_tokens`), so
the progress display counts tokens as they stream rather than when a turn ends.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal

from askspec.ir.vocab import SAMPLING_DEFAULTS, SAMPLING_NUMBERS
from askspec.runtime.backends.prompt_tokens import CHAR_ESTIMATE, PromptTokenizer

FinishReason = Literal["stop", "length", "error"]

# Sampling, ChatRequest and ChatResult are values: built once per model call and never
# changed after (a backend that needs another sampling builds a new one). They are not
# declared frozen because a frozen dataclass's __init__ stores each field through
# object.__setattr__, about four times the cost of a plain one, and three are built on
# every call; slots keep them small.

@dataclass(slots=True)
class Sampling:
    """Sampling fields a spec may set on a model (askspec.ir.vocab.SAMPLING_FIELDS, one
    attribute each); None means the backend's default."""

    temperature: float = float(SAMPLING_DEFAULTS["temperature"])
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int = int(SAMPLING_DEFAULTS["max_tokens"])
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def given(self) -> dict[str, Any]:
        """The fields that are set (None ones and an empty `stop` left out), typed as the
        wire formats want them (`stop` as a list): what a backend maps onto its API."""
        out: dict[str, Any] = {}
        for name, cast in SAMPLING_NUMBERS.items():
            value = getattr(self, name)
            if value is not None:
                out[name] = cast(value)
        if self.stop:
            out["stop"] = list(self.stop)
        return out



@dataclass(slots=True)
class ChatRequest:
    """One model call.

    `model` is the weights/endpoint model name from the spec (for hf: a weights spec such
    as "smollm2-135m-instruct" or a local folder; for openai: the served model name).
    `session_index` and `role` identify the caller (the replay backend keys on them,
    others use them only for logging). `call_index` is the role's 0-based call count
    within the session.
    """

    messages: tuple[dict[str, str], ...]
    sampling: Sampling = field(default_factory=Sampling)
    model: str = ""
    role: str = ""
    session_index: int = 0
    call_index: int = 0
    # which reply of a `sample N ask` the call belongs to ("x{ask}.{i}", its recovery turns
    # included): the trajectory it extends (an OpenRLHF agent's siblings, runtime/targets)
    sample_key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    # ask for the token-level record a trainer needs (ChatResult.prompt_ids and below);
    # backends that cannot give it ignore the flag and leave those fields None
    rollout: bool = False
    # called with the number of tokens generated since the last call, while the request
    # runs (per token or per decode step); from any thread, so it must be cheap and
    # thread-safe. Backends that only learn the count at the end never call it.
    on_tokens: Callable[[int], None] | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class ChatResult:
    text: str
    finish_reason: FinishReason = "stop"
    tokens_in: int = 0
    tokens_out: int = 0
    latency_ms: float = 0.0
    # from the call to its first generated token (prefill, and any wait for a batch slot),
    # on backends that can tell; None elsewhere
    ttft_ms: float | None = None
    # with ChatRequest.rollout, on backends that can: the prompt's token ids after the chat
    # template, the completion's ids (the end-of-sequence token included when it ended the
    # reply) and each completion token's log-probability under the sampling weights at the
    # request's temperature (log_softmax(logits / T); T = 1 when greedy), before top-p/top-k
    prompt_ids: tuple[int, ...] | None = None
    completion_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None


class BackendError(Exception):
    """A model call failed for good (after the backend's own retries)."""


@dataclass(frozen=True)
class SpecContext:
    """What a backend needs besides a model's own spec options to choose its constructor
    options: the spec's folder (relative paths) and the run's command-line choices."""

    spec_dir: str = "."
    base_url: str | None = None  # --base-url: the endpoint of every openai model
    default_base_url: str | None = None  # for openai models that name none (else $OPENAI_BASE_URL)
    replay: str | None = None  # --replay FILE: the recording of every replay model


class Backend(abc.ABC):
    """A model provider. Instances are created once per (backend, model) and shared."""

    name: str = "backend"
    endpoint: str | None = None  # where calls go, for a backend that calls a server

    @classmethod
    def spec_options(cls, model: str, options: dict[str, Any], context: SpecContext) -> dict[str, Any]:
        """A spec model's options (`concurrency`, `retries`, `file`, ...) as this backend's
        constructor options. The default passes them through; the registry then drops
        those the constructor does not take."""
        return dict(options)

    async def prepare(self) -> None:
        """Get ready for the first call (load weights); the default has nothing to do."""
        return None

    def determinism(self, concurrency: int) -> dict[str, Any]:
        """What a run at this `--concurrency` can promise about getting the same replies
        again from the same seed (recorded in the run manifest): {"level", "why"}. Levels:
        "exact" (the replies do not depend on the run at all), "callable" (the same
        requests are made; the replies are the callable's business), "seed" (the same
        seed gives the same text on the same weights, software and hardware), "batch"
        (as "seed" only when calls meet the same batch composition, which timing
        decides), "server" (up to the server)."""
        return {"level": "server", "why": "each call's seed is sent to the server; whether it gives the same reply again "
                                          "depends on the server (vLLM and llama.cpp servers batch requests too)"}

    def torch_threads(self) -> int | None:
        """The torch CPU threads this backend's model wants, None when it runs no torch in
        this process. torch's setting is the process's: the command that owns the process
        applies it (commands/resolver.py), never the backend."""
        return None

    def preparation(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """The steps `prepare` takes, each as (what it does, the coroutine function doing
        it), so that `askspec run` shows each on a line of its own (a one-time conversion
        apart from the load). Default: one step, `prepare`, when a backend has one."""
        if type(self).prepare is Backend.prepare:
            return []
        return [("preparing", self.prepare)]

    async def prompt_tokenizer(self, model: str) -> PromptTokenizer:
        """What counts a prompt's tokens for `model` as this backend sends it (a role's
        `max_prompt_tokens`). The default, for a backend without a tokenizer of its own,
        is the documented estimate (prompt_tokens.CharEstimate)."""
        return CHAR_ESTIMATE

    @abc.abstractmethod
    async def complete(self, request: ChatRequest) -> ChatResult:
        """Answer one chat request; raise BackendError when it cannot."""

    async def aclose(self) -> None:  # pragma: no cover - default no-op
        return None
