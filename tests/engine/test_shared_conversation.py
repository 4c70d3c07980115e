"""`memory = shared(NAME)`: roles that share a conversation see each other's turns as user
messages tagged with the speaker and their own as assistant messages, once each; turns of
one `ask a, b` are unseen by each other; the store keeps who said what."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import fake_models

from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

DEBATE = """
model m = python("fake_models:remember_messages")
role pro { model = m; memory = shared(debate); system = "You argue for."; prompt = "P{{ r }}" }
role con { model = m; memory = shared(debate); prompt = "C{{ r }}" }
role judge { model = m; memory = shared(debate); prompt = "Who won?" }
game g {
    repeat r in 1..2 {
        ask pro
        ask con
    }
    ask judge
}
"""


def run(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.ask"
    path.write_text(text)
    fake_models.SEEN.clear()
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True))
    assert rc == 0
    return Path(run_dir)


def seen() -> dict[tuple[str, int], list[tuple[str, str]]]:
    return {(role, call): messages for role, call, messages in fake_models.SEEN}


def test_each_role_sees_the_others_tagged_and_its_own_turns_once(tmp_path):
    run(tmp_path, DEBATE)
    got = seen()
    assert got[("pro", 0)] == [("system", "You argue for."), ("user", "P1")]
    assert got[("con", 0)] == [("user", "pro: pro 0\n\nC1")]
    assert got[("pro", 1)] == [("system", "You argue for."), ("user", "P1"), ("assistant", "pro 0"),
                               ("user", "con: con 0\n\nP2")]
    assert got[("con", 1)] == [("user", "pro: pro 0\n\nC1"), ("assistant", "con 0"), ("user", "pro: pro 1\n\nC2")]
    # the judge joins at the end: every turn, tagged, in the order spoken; no one's prompt but its own
    assert got[("judge", 0)] == [("user", "pro: pro 0\n\ncon: con 0\n\npro: pro 1\n\ncon: con 1\n\nWho won?")]


def test_the_roles_of_one_ask_do_not_see_each_other(tmp_path):
    run(tmp_path, """
model m = python("fake_models:remember_messages")
role a, b { model = m; memory = shared(talk); prompt = "go" }
game g {
    ask b, a
    ask a
    s = sample 2 ask b
    ask b
}
""")
    got = seen()
    assert got[("b", 0)] == got[("a", 0)] == [("user", "go")]
    # a did not see b's reply of that ask: its own turn comes first, then b's
    assert got[("a", 1)] == [("user", "go"), ("assistant", "a 0"), ("user", "b: b 0\n\ngo")]
    # a `sample N ask` reads the conversation and adds nothing to it
    expected = [("user", "go"), ("assistant", "b 0"), ("user", "a: a 0\n\na: a 1\n\ngo")]
    assert got[("b", 1)] == got[("b", 2)] == got[("b", 3)] == expected


def test_the_store_keeps_who_said_what(tmp_path):
    con = open_store(run(tmp_path, DEBATE))
    rows = con.execute("select role, text, prompt from turns order by turn_index").fetchall()
    assert [(r[0], r[1]) for r in rows] == [("pro", "pro 0"), ("con", "con 0"), ("pro", "pro 1"), ("con", "con 1"),
                                            ("judge", "judge 0")]
    judge_prompt = json.loads(rows[-1][2])
    assert judge_prompt[-1]["content"].startswith("pro: pro 0\n\ncon: con 0")
