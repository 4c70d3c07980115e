"""A role's `max_prompt_tokens`: a prompt that opens the role's conversation and is over
the cap is cut from the left of its new message (`truncate_left`) or ends the session
with the named outcome (`end(OUTCOME)`), counted with the backend's tokenizer (hf) or the
documented estimate (python: 4 characters a token, 4 a message)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import fake_models

from askspec.runtime.backends.prompt_tokens import CHAR_ESTIMATE
from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

DIGITS = "0123456789" * 10  # 100 characters: 25 estimated tokens, 29 as a message


def run(tmp_path: Path, text: str, rc: int = 0) -> Path:
    path = tmp_path / "t.ask"
    path.write_text(text)
    fake_models.SEEN.clear()
    got, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True))
    assert got == rc
    return Path(run_dir)


def sent(role: str) -> list[list[tuple[str, str]]]:
    return [messages for r, _, messages in fake_models.SEEN if r == role]


def test_truncate_left_keeps_the_system_prompt_and_the_end_of_the_message(tmp_path):
    run(tmp_path, f"""
model m = python("fake_models:remember_messages")
role q {{ model = m; memory = none; system = "sys"; max_prompt_tokens = 12; prompt_overflow = truncate_left }}
game g {{ ask q: "{DIGITS}" }}
""")
    [messages] = sent("q")
    # 5 + 29 = 34 estimated tokens; 22 tokens (88 characters) cut from the message's start
    assert messages == [("system", "sys"), ("user", DIGITS[-12:])]
    assert CHAR_ESTIMATE.chat_length([{"role": r, "content": c} for r, c in messages]) == 12


def test_a_prompt_under_the_cap_is_sent_as_it_is(tmp_path):
    run(tmp_path, f"""
model m = python("fake_models:remember_messages")
role q {{ model = m; memory = none; max_prompt_tokens = 29; prompt_overflow = truncate_left }}
game g {{ ask q: "{DIGITS}" }}
""")
    assert sent("q") == [[("user", DIGITS)]]


def test_only_a_prompt_that_opens_the_conversation_is_capped(tmp_path):
    # memory = full: the second call carries the first exchange, which a rollout counts as response
    run(tmp_path, f"""
model m = python("fake_models:remember_messages")
role q {{ model = m; memory = full; max_prompt_tokens = 29; prompt_overflow = end(too_long) }}
game g {{
    outcomes done, too_long
    ask q: "{DIGITS}"
    ask q: "{DIGITS}"
    end done
}}
""")
    assert [len(m) for m in sent("q")] == [1, 3]


def test_end_names_the_outcome_and_the_role_is_not_called(tmp_path):
    con = open_store(run(tmp_path, f"""
model m = python("fake_models:remember_messages")
role opener {{ model = m; memory = none; prompt = "hi" }}
role q {{ model = m; memory = none; max_prompt_tokens = 28; prompt_overflow = end(too_long) }}
game g {{
    outcomes done, too_long
    ask opener
    s = sample 3 ask q: "{DIGITS}"
    end done
}}
"""))
    assert con.execute("select outcome, status from sessions").fetchall() == [("too_long", "ok")]
    assert [r[0] for r in con.execute("select role from turns").fetchall()] == ["opener"]
    assert sent("q") == []


def test_a_system_prompt_over_the_cap_fails_the_session_saying_why(tmp_path):
    con = open_store(run(tmp_path, f"""
model m = python("fake_models:remember_messages")
role q {{ model = m; memory = none; system = "{DIGITS}"; max_prompt_tokens = 20; prompt_overflow = truncate_left }}
game g {{ ask q: "hello there" }}
""", rc=3))  # no session succeeded
    status, error = con.execute("select status, error from sessions").fetchone()
    assert status == "error" and "over max_prompt_tokens = 20" in error and "system prompt" in error


def test_the_hf_backend_counts_with_its_tokenizer(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    con = open_store(run(tmp_path, f"""
model m = hf("{tiny_model}") {{ max_tokens = 1; temperature = 0 }}
role q {{ model = m; memory = none; system = "Be brief."; max_prompt_tokens = 40; prompt_overflow = truncate_left }}
game g {{ ask q: "{' '.join(f'word{i}' for i in range(60))}" }}
"""))
    prompt, tokens_in = con.execute("select prompt, tokens_in from turns").fetchone()
    messages = json.loads(prompt)
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert 30 < len(ids) <= 40 and tokens_in == len(ids)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["content"].endswith("word58 word59") and "word0 " not in messages[1]["content"]


def test_a_cut_prompt_in_a_shared_conversation_is_remembered_as_it_was_sent(tmp_path):
    # b's first message (a's tagged turn and b's own prompt, joined) is cut; its second
    # call carries that first message as it was sent, as `memory = full` does
    run(tmp_path, f"""
model m = python("fake_models:remember_messages")
role a {{ model = m; memory = shared(talk); prompt = "go" }}
role b {{ model = m; memory = shared(talk); max_prompt_tokens = 12; prompt_overflow = truncate_left; prompt = "{DIGITS}" }}
game g {{
    ask a
    ask b
    ask a
    ask b
}}
""")
    first, second = sent("b")
    assert first == [("user", DIGITS[-32:])]  # "a: a 0" and the start of the digits cut away
    assert second[:2] == [("user", DIGITS[-32:]), ("assistant", "b 0")]
    assert second[2] == ("user", f"a: a 1\n\n{DIGITS}")  # (not the opening prompt: sent whole)
