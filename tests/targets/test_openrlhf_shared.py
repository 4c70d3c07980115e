"""A trained role in a shared conversation (`memory = shared(NAME)`) keeps one conversation
a session, as `memory = full` does: asked several times, it is one OpenRLHF trajectory
(its earlier turns stay a prefix of what it is sent), so the target does not refuse it."""

from __future__ import annotations

from pathlib import Path

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
