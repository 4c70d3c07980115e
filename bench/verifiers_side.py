"""The verifiers half of bench_orchestration.py: verifiers 0.3.1's classic MultiTurnEnv
playing the same game as askspec's side, against a model that answers instantly.

Run from verifiers' own virtual environment (bench_orchestration.py does that):

    python bench/verifiers_side.py [--sessions 2000] [--turns 8] [--client mock|openai]

Prints ONE line of JSON on stdout: {"calls": ..., "seconds": ..., "ms_per_call": ...}.
Everything else (logging, warnings) goes to stderr.

The game (equivalent to askspec's SPEC in bench_orchestration.py)
    One chat prompt per session, "Turn 1 of T: continue the game." (no system prompt);
    the model replies "#Answer# ok"; the environment's `env_response` answers with the
    single user message "Turn t of T: continue the game."; T model turns per session.
    Completion is verifiers' own `max_turns_reached` stop condition with max_turns=T
    (in 0.3.1 `is_completed` is @final and composed of @vf.stop conditions; max_turns is
    the standard way to stop after T assistant turns). Full history: the standard
    MultiTurnEnv behaviour (every request carries the whole conversation so far).

Which verifiers stack and path
    `verifiers.legacy` (= the classic `verifiers.envs` / `import verifiers as vf`
    surface, through 0.3.1's alias finder): `vf.MultiTurnEnv` subclass, run with
    `Environment.evaluate(...)`, the library entry point of an evaluation
    (evaluate -> generate -> run_group -> rollout -> get_model_response, then rubric
    scoring, state_to_output (in a worker thread, as verifiers does) and the outputs
    builder). Defaults kept: max_concurrent=-1 (no semaphore: every session is a task
    at once, i.e. no throttling), grouped scoring (independent_scoring=False),
    rollouts_per_example=1, max_retries=0. The event loop gets a default thread pool
    of env.max_workers (512) threads, exactly as `Environment.generate_sync` /
    `evaluate_sync` set it up (evaluate_sync itself is not used only because it does
    not forward the on_start/on_progress callbacks below).
    Not used: the `vf-eval` CLI's default of running the environment in a separate
    ZMQ env-server process (multi-process, needs an installable env id; its
    disable_env_server mode is this same in-process evaluate call).

The client (what stands in for the model)
    --client mock (default): verifiers' own way of mocking the model, after the
        MockClient of its test suite (tests/conftest.py in the verifiers repository; it is
        not shipped in the wheel, hence re-created here): a `vf.Client` subclass whose
        `get_response` returns a `vf.Response` at once (content "#Answer# ok",
        finish_reason "stop", usage 10/3/13 tokens), built once and reused, so the
        client costs ~nothing. This is the like-for-like counterpart of askspec's
        in-process Python model (`bench_instant.reply`), which also goes through no
        provider adapter or wire format. It is the cheapest verifiers path, so it is
        the conservative baseline for askspec's ratio.
    --client openai: the same instant model behind verifiers' OpenAI adapter,
        `vf.OpenAIChatCompletionsClient`, wrapping a stand-in for `openai.AsyncOpenAI`.
        0.3.1's adapter does not call `client.chat.completions.create(...)`: it calls
        `client.post("/chat/completions", body=..., cast_to=httpx.Response)` and decodes
        the raw body itself (`ChatCompletion.model_validate_json`, to recover vLLM's
        routed-experts side-car). So the stand-in answers `post` with a prebuilt body
        (the JSON of one real `openai.types.chat.ChatCompletion`, same content and
        usage), built once and reused; it also implements `chat.completions.create`
        (returning the prebuilt ChatCompletion object) for completeness. This adds the
        per-call adapter work (messages -> OpenAI params, sampling-args normalisation,
        body decoding, validity checks, -> vf.Response): the path of an evaluation
        against an OpenAI-compatible server, minus the socket. About 0.13 ms/call
        more than the mock on the 2-core dev box.
    Both count the calls they serve; the run asserts calls == sessions * turns.

Extras switched off (not part of running the game)
    save_results=False, push_to_hf_hub=False (defaults: nothing is written to disk);
    HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1 (no hub access; the dataset is an in-memory
    `datasets.Dataset.from_dict` built before timing); the tqdm progress bar is replaced
    by no-op on_start/on_progress callbacks (a UI extra; verifiers' own callback hook).
    Kept, because verifiers always runs them: rubric scoring (one trivial reward
    function returning 1.0, plus the num_turns metric MultiTurnEnv always adds),
    per-rollout timing spans, usage tracking, state_to_output and the incremental
    metadata builder.

Timing
    time.perf_counter around one `await env.evaluate(...)` over all sessions, after a
    warm-up evaluate of 20 sessions in the same process (imports, first-call paths).
    The timed region includes evaluate's `dataset.to_list()` of the inputs (a few ms
    for thousands of rows), but not building the environment or the dataset. Wall
    time is what is reported; process CPU time is logged to stderr as well, which is
    steadier on a shared machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
warnings.simplefilter("ignore")

import verifiers as vf  # noqa: E402  (classic stack, via 0.3.1's alias finder to verifiers.legacy)
from datasets import Dataset  # noqa: E402
from openai.types.chat import ChatCompletion  # noqa: E402
from verifiers.clients import Client, OpenAIChatCompletionsClient  # noqa: E402
from verifiers.types import Response, ResponseMessage, Usage  # noqa: E402

REPLY = "#Answer# ok"
MODEL = "instant"
WARMUP_SESSIONS = 20


def turn_message(t: int, turns: int) -> str:
    return f"Turn {t} of {turns}: continue the game."


# --------------------------------------------------------------------------- clients


def prebuilt_chat_completion() -> ChatCompletion:
    return ChatCompletion.model_validate({
        "id": "chatcmpl-instant",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": REPLY},
            "finish_reason": "stop",
            "logprobs": None,
        }],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    })


class _RawBody:
    """What `client.post(..., cast_to=httpx.Response)` hands back, as far as verifiers
    reads it (`.content`)."""

    __slots__ = ("content",)

    def __init__(self, content: bytes):
        self.content = content


class _Completions:
    def __init__(self, owner: "InstantAsyncOpenAI"):
        self._owner = owner

    async def create(self, **kwargs) -> ChatCompletion:
        self._owner.calls += 1
        return self._owner.completion


class _Chat:
    def __init__(self, owner: "InstantAsyncOpenAI"):
        self.completions = _Completions(owner)


class InstantAsyncOpenAI:
    """Stand-in for openai.AsyncOpenAI that answers at once, in-process, with one
    prebuilt response (the same object / the same bytes every time)."""

    base_url = "http://instant.invalid/v1/"

    def __init__(self) -> None:
        self.calls = 0
        self.completion = prebuilt_chat_completion()
        self._raw = _RawBody(self.completion.model_dump_json().encode())
        self.chat = _Chat(self)

    async def post(self, path, *, body=None, cast_to=None, options=None, **kwargs):
        self.calls += 1
        return self._raw

    async def close(self) -> None:
        pass


class InstantMockClient(Client):
    """A vf.Client returning one prebuilt vf.Response, after verifiers' test MockClient."""

    def __init__(self) -> None:
        self.logger = logging.getLogger(f"{__name__}.InstantMockClient")
        self._config = None
        self._client = None
        self.calls = 0
        self._response = Response(
            id="chatcmpl-instant", created=0, model=MODEL,
            usage=Usage(prompt_tokens=10, reasoning_tokens=0, completion_tokens=3, total_tokens=13),
            message=ResponseMessage(content=REPLY, reasoning_content=None, finish_reason="stop",
                                    is_truncated=False, tokens=None, tool_calls=None),
        )

    async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs) -> Response:
        self.calls += 1
        return self._response

    def setup_client(self, config):
        return None

    async def to_native_tool(self, tool):
        return tool

    async def to_native_prompt(self, messages):
        return messages, {}

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        return self._response

    async def raise_from_native_response(self, response) -> None:
        pass

    async def from_native_response(self, response):
        return response

    async def close(self) -> None:
        pass


# --------------------------------------------------------------------------- environment


class TurnGameEnv(vf.MultiTurnEnv):
    """T model turns; after each of the first T-1 the environment says whose turn it is."""

    def __init__(self, turns: int, **kwargs):
        super().__init__(max_turns=turns, **kwargs)
        self.turns = turns

    async def env_response(self, messages, state, **kwargs):
        t = len(state["trajectory"]) + 1  # the model turn about to be asked for
        # vf.UserMessage rather than a raw dict: verifiers warns that dicts are re-validated
        # (pydantic) on every turn and asks environments to return vf.Message objects
        return [vf.UserMessage(content=turn_message(t, self.turns))]


def one(**kwargs) -> float:
    return 1.0


def build_env(sessions: int, turns: int) -> TurnGameEnv:
    first = [{"role": "user", "content": turn_message(1, turns)}]
    dataset = Dataset.from_dict({
        "prompt": [first] * sessions,
        "answer": [""] * sessions,
        "example_id": list(range(sessions)),
    })
    return TurnGameEnv(turns, eval_dataset=dataset, rubric=vf.Rubric(funcs=[one], weights=[1.0]))


# --------------------------------------------------------------------------- run


def _noop(*args, **kwargs) -> None:
    return None


async def evaluate(env: TurnGameEnv, client, n: int):
    return await env.evaluate(
        client=client,
        model=MODEL,
        num_examples=n,
        rollouts_per_example=1,
        max_concurrent=-1,
        save_results=False,
        push_to_hf_hub=False,
        on_start=_noop,
        on_progress=_noop,
    )


async def bench(env: TurnGameEnv, counter, client, sessions: int, turns: int) -> dict:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=env.max_workers))  # as generate_sync does

    warm = await evaluate(env, client, min(WARMUP_SESSIONS, sessions))
    check(warm, counter.calls, min(WARMUP_SESSIONS, sessions), turns)

    counter.calls = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    results = await evaluate(env, client, sessions)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    calls = counter.calls
    print(f"wall {elapsed:.3f} s, process cpu {cpu:.3f} s ({1000 * cpu / calls:.4f} ms/call)", file=sys.stderr)
    check(results, calls, sessions, turns)
    return {"calls": calls, "seconds": elapsed, "ms_per_call": 1000 * elapsed / calls, "cpu_ms_per_call": 1000 * cpu / calls}


def check(results, calls: int, sessions: int, turns: int) -> None:
    outputs = results["outputs"]
    assert calls == sessions * turns, (calls, sessions, turns)
    assert len(outputs) == sessions, len(outputs)
    bad = [o for o in outputs if o.get("error") is not None or o.get("stop_condition") != "max_turns_reached"]
    assert not bad, (bad[0].get("error"), bad[0].get("stop_condition"))
    completion = outputs[0]["completion"]
    # T assistant replies and T-1 environment turns after the first prompt
    assert len(completion) == 2 * turns - 1, len(completion)
    assert outputs[0]["reward"] == 1.0, outputs[0]["reward"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--client", choices=("mock", "openai"), default="mock")
    args = ap.parse_args()

    env = build_env(args.sessions, args.turns)
    if args.client == "openai":
        counter = InstantAsyncOpenAI()
        client = OpenAIChatCompletionsClient(counter)
    else:
        counter = client = InstantMockClient()
    print(f"verifiers {vf.__version__ if hasattr(vf, '__version__') else '?'}: "
          f"{type(env).__mro__[1].__module__}.MultiTurnEnv, client={args.client}", file=sys.stderr)

    result = asyncio.run(bench(env, counter, client, args.sessions, args.turns))
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
