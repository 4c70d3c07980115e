"""A trained role in a shared conversation (`memory = shared(NAME)`) keeps one conversation
a session, as `memory = full` does: asked several times, it is one OpenRLHF trajectory
(its earlier turns stay a prefix of what it is sent), so the target does not refuse it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_openrlhf_refusals import refusals

SPEC = """
model m = hf("smollm2-135m-instruct") {{ max_tokens = 32 }}
role p {{ model = m; trained; memory = {memory} }}
role q {{ model = m; memory = {memory} }}
game g for x in [1, 2] sample 4 {{
    repeat 2 {{
        r = ask p using "Say {{{{ x }}}}."
        ask q using "Answer."
    }}
    reward p = 1.0
}}
train p with grpo {{ group = 4 }}
"""


def test_a_shared_conversation_is_one_trajectory(tmp_path: Path) -> None:
    spec = tmp_path / "s.ask"
    spec.write_text(SPEC.format(memory="shared(talk)"))
    assert refusals(spec, tmp_path) == ""
    spec.write_text(SPEC.format(memory="none"))
    assert "error[E603]" in refusals(spec, tmp_path)


@pytest.mark.slow  # the SmolLM2 tokenizer, as the other agent tests
def test_the_agent_plays_a_shared_conversation_as_one_token_sequence(tmp_path: Path, monkeypatch) -> None:
    import asyncio
    import json

    from openrlhf_harness import smollm2_tokenizer
    from test_openrlhf_agent import drive, make_job, replay_frozen_roles

    spec = tmp_path / "s.ask"
    spec.write_text(SPEC.format(memory="shared(talk)"))
    job = make_job(spec, tmp_path / "job", {})
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": [{"q": [f"q{k} first", f"q{k} second"]} for k in range(8)]}))
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    tokenizer = smollm2_tokenizer()
    responses, engine = asyncio.run(asyncio.wait_for(drive(job, tokenizer, None, 4, lambda prompt: "p speaks"), 60))
    assert len(responses) == 8
    for r in responses:
        assert r["extra_logs"]["askspec_kept_attempts"] == 0  # each call extended the sequence as it was
        assert len(r["action_ranges"]) == 2  # both of p's turns are trained on
    # p's second prompt: its first exchange once, then q's turn tagged with q's name before its new message
    second = [tokenizer.decode(c["prompt_ids"]) for c in engine.calls if "q: q" in tokenizer.decode(c["prompt_ids"])]
    assert len(second) == 8
    for text in second:
        assert re.search(r"<\|im_start\|>user\nSay (1|2)\.<\|im_end\|>\n<\|im_start\|>assistant\np speaks<\|im_end\|>\n"
                         r"<\|im_start\|>user\nq: q\d first\n\nSay \1\.<\|im_end\|>\n<\|im_start\|>assistant\n$", text), text
        assert text.count("p speaks") == 1
