"""One parse verdict: the reply parser decides parsed / not parsed before any fallback
fills a field, and the engine acts on that verdict (a `boxed` reply without \\boxed{}
gets a fallback `answer` but is not parsed, so recovery fires)."""

from __future__ import annotations

import asyncio

from askspec.ir import model as ir
from askspec.runtime.commands.run import run_spec
from askspec.runtime.engine.calls import parse_reply
from askspec.runtime.replies import parsers
from askspec.runtime.store.views import open_store

SPEC = """
model m = python("fake_models:boxed_on_second_try")
role solver {
    model = m
    memory = full
    reply = boxed
    recover = "Put your final answer in \\\\boxed{}."
    retries = 1
    prompt = "What is 3 + 4?"
}
game g {
    outcomes solved, unsolved
    r = ask solver
    if r.parsed { end solved } else { end unsolved }
}
"""


def test_boxed_without_a_box_is_not_parsed_by_the_engine_either():
    boxed = ir.ReplyParser(kind="boxed", fields=["answer"], required=["answer"])
    standalone = parsers.parse("boxed", "the answer is 7")
    engine = parse_reply(boxed, "the answer is 7", "stop")
    assert not standalone.ok
    assert engine["ok"] is False and engine["missing"] == ["answer"]
    assert engine["fields"]["answer"] == "7"  # the fallback word is still there to read
    assert parse_reply(boxed, "so \\boxed{7}", "stop")["ok"] is True


def test_boxed_recovery_turn_fires(tmp_path):
    path = tmp_path / "t.ask"
    path.write_text(SPEC)
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True, sessions=1))
    assert rc == 0
    con = open_store(run_dir)
    turns = con.execute("select count(*) from turns where role = 'solver'").fetchone()[0]
    outcome = con.execute("select outcome from sessions").fetchone()[0]
    assert turns == 2  # the first reply, then the recovery turn
    assert outcome == "solved"
