"""One parse verdict: the reply parser decides parsed / not parsed before any fallback
fills a field, and the engine acts on that verdict (a `boxed` reply without \\boxed{}
gets a fallback `answer` but is not parsed, so recovery fires)."""

from __future__ import annotations

import asyncio
import json

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


UNDERSCORE_SPEC = """
model m = python("fake_models:final_answer_on_second_try")
role solver {
    model = m
    memory = full
    reply = sections("#Reasoning#", "#Final_Answer#")
    recover = "End with your answer after #Final_Answer#."
    retries = 1
    prompt = "What is 3 + 4?"
}
game g {
    outcomes solved, unsolved
    r = ask solver
    if r.parsed and r.final_answer == "7" { end solved } else { end unsolved }
}
"""


def test_an_underscore_tag_names_one_field_for_the_checker_and_the_parser():
    # the checker's field (the IR's `fields` and `required`) is the parser's: `#Final_Answer#`
    # is `final_answer` on both sides, so a reply without it is missing that required field
    from askspec.lang.compiler import compile_source

    res = compile_source("t.ask", UNDERSCORE_SPEC, {})
    assert res.ok, [d.message for d in res.sink.items]
    (solver,) = [r for r in res.ir.roles if r.name == "solver"]
    assert solver.reply.fields == ["reasoning", "final_answer"] and solver.reply.required == ["final_answer"]
    assert list(parsers.parse("sections", "#Final_Answer# 7", solver.reply.args).fields)[:2] == solver.reply.fields
    engine = parse_reply(solver.reply, "#Reasoning#\nthink", "stop")
    assert engine["ok"] is False and engine["missing"] == ["final_answer"]
    done = parse_reply(solver.reply, "#Reasoning#\nthink\n#Final_Answer#\n7", "stop")
    assert done["ok"] is True and done["fields"]["final_answer"] == "7"


def test_an_underscore_tag_missing_from_the_reply_is_unparsed_and_recovered(tmp_path):
    path = tmp_path / "t.ask"
    path.write_text(UNDERSCORE_SPEC)
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True, sessions=1))
    assert rc == 0
    con = open_store(run_dir)
    rows = con.execute("select parsed from turns where role = 'solver' order by turn_index").fetchall()
    parsed = [json.loads(p) if isinstance(p, str) else p for (p,) in rows]
    outcome = con.execute("select outcome from sessions").fetchone()[0]
    # the reply without #Final_Answer#, then the recovery turn
    assert [(p["parsed"], p["final_answer"]) for p in parsed] == [(False, None), (True, "7")]
    assert outcome == "solved"
