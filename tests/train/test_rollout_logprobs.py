"""The hf backend's rollout record (prompt ids after the chat template, completion ids,
sampling log-probs) agrees with what the trainer recomputes from the same weights: the
"old" log-probs of the first update are the current policy's, up to batching noise."""

from __future__ import annotations

import asyncio

import pytest
import torch

from askspec.ir import model as ir
from askspec.lang.training import lower_training
from askspec.runtime.backends.base import ChatRequest, Sampling
from askspec.runtime.train.batch import Turn
from askspec.runtime.train.config import config_from_ir

pytestmark = pytest.mark.slow


def test_recorded_logprobs_match_the_trainers_forward():
    from askspec.runtime.train.policy import TrainedPolicy

    exp = lower_training(ir.Experiment(name="t", roles=[ir.Role(name="r", trained=True)],
                                       training=[ir.Training(role="r", algorithm="grpo")]), {})
    policy = TrainedPolicy(config_from_ir(exp.training[0], exp), "smollm2-135m-instruct")

    async def ask(text: str, temperature: float, seed: int):
        req = ChatRequest(messages=({"role": "user", "content": text},), rollout=True,
                          sampling=Sampling(temperature=temperature, max_tokens=12, seed=seed))
        return await policy.backend.complete(req)

    async def both():
        try:
            return await asyncio.gather(ask("What is 2 + 3?", 1.0, 1), ask("Name a colour.", 0.7, 2),
                                        ask("Say hi.", 0.0, 3))
        finally:
            await policy.backend.aclose()

    results = asyncio.run(both())
    turns = []
    for res, temp in zip(results, (1.0, 0.7, 0.0)):
        assert res.prompt_ids and res.completion_ids and len(res.logprobs) == len(res.completion_ids) == res.tokens_out
        assert res.prompt_ids[-4:] == tuple(policy.tokenizer.encode("<|im_start|>assistant\n"))  # the chat template
        if res.finish_reason == "stop":
            assert res.completion_ids[-1] == 2  # <|im_end|> ends a reply and is trained on
        assert policy.tokenizer.decode(res.completion_ids, skip_special_tokens=True).startswith(res.text[:5])
        turns.append(Turn("s", 1, 0, list(res.prompt_ids), list(res.completion_ids), list(res.logprobs), temp,
                          res.finish_reason))
    with torch.no_grad():
        logp, mask = policy.token_logprobs(policy.model, turns)
    for i, t in enumerate(turns):
        n = len(t.completion_ids)
        assert torch.allclose(logp[i, :n], torch.tensor(t.logprobs), atol=2e-3), i
        assert mask[i, :n].sum() == n and mask[i, n:].sum() == 0
