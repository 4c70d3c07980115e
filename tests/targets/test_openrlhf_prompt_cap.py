"""A role's `max_prompt_tokens` in an OpenRLHF job: the generated agent plays the session
with askspec's engine, which counts the trained role's prompt with OpenRLHF's tokenizer
(the `hf_tokenizer` the rollout hands the agent) and cuts it before vLLM sees it; a prompt
that ends the session leaves the rollout without a loss."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from openrlhf_harness import FakeEngine, smollm2_tokenizer
from test_openrlhf_agent import drive, make_job

pytestmark = pytest.mark.slow  # the SmolLM2 tokenizer, as the other agent tests

WORDS = " ".join(f"word{i}" for i in range(80))
SPEC = """
model m = hf("smollm2-135m-instruct") {{ max_tokens = 8 }}
role q {{ model = m; trained; memory = none; system = "Be brief."; max_prompt_tokens = 40; prompt_overflow = {over} }}
game g for x in ["{words}", "short"] sample 2 {{
    outcomes done, too_long
    a = ask q: x
    reward q = 1.0
    end done
}}
train q with rloo {{ lr = 0.000001 }}
"""


def play(tmp_path: Path, over: str, monkeypatch) -> tuple[list[dict], FakeEngine]:
    spec = tmp_path / "cap.ask"
    spec.write_text(SPEC.format(over=over, words=WORDS))
    job = make_job(spec, tmp_path / "job", {})
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    return asyncio.run(asyncio.wait_for(drive(job, smollm2_tokenizer(), None, 2, lambda prompt: "ok"), 60))


def test_the_trained_roles_prompt_is_cut_to_the_cap_by_openrlhfs_tokenizer(tmp_path, monkeypatch):
    responses, engine = play(tmp_path, "truncate_left", monkeypatch)
    long_calls, short_calls = engine.calls[:2], engine.calls[2:]
    assert len(short_calls) == 2 and all(30 < len(c["prompt_ids"]) <= 40 for c in long_calls)
    prompt = engine.tokenizer.decode(long_calls[0]["prompt_ids"])
    assert "Be brief." in prompt and "word78 word79" in prompt and "word0 " not in prompt
    assert [r["reward"] for r in responses] == [1.0] * 4


def test_a_prompt_that_ends_the_session_is_not_generated(tmp_path, monkeypatch):
    responses, engine = play(tmp_path, "end(too_long)", monkeypatch)
    assert len(engine.calls) == 2 and all("short" in engine.tokenizer.decode(c["prompt_ids"]) for c in engine.calls)
    assert [(r["reward"], r["action_ranges"] == []) for r in responses] == [(0.0, True)] * 2 + [(1.0, False)] * 2
