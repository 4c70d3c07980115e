"""A reply is the spec's dict of fields; what the engine keeps about it (the turn's index,
the fields the parser missed) are attributes of a `Reply`, not keys a spec could read or
iterate, and they still place a per-turn reward and fill a recovery prompt's `missing`."""

from __future__ import annotations

import asyncio
import copy
import pickle

from askspec.runtime.commands.run import run_spec
from askspec.runtime.engine.state import Reply
from askspec.runtime.store.views import open_store

SPEC = """
model m = python("fake_models:boxed_on_second_try")
role solver {
    model = m
    memory = none
    reply = boxed
    recover = "Missing: {{ missing | join(',') }}. You said: {{ reply }}"
    retries = 1
}
game g {
    r = ask solver using "What is 3 + 4?"
    s = ask solver using "keys: {{ r | sort | join(',') }}"
    reward r as first = 1.0
    reward s as second = 2.0
}
"""


def test_turn_and_missing_are_attributes_that_place_rewards_and_fill_recovery(tmp_path):
    path = tmp_path / "t.ask"
    path.write_text(SPEC)
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True, sessions=1))
    assert rc == 0
    con = open_store(run_dir)
    prompts = [p for (p,) in con.execute("SELECT prompt[-1]->>'content' FROM turns ORDER BY turn_index").fetchall()]
    # each ask: a reply without \\boxed{}, then the recovery turn that gets it
    assert prompts[1] == "Missing: answer. You said: the answer is 7"
    assert prompts[2] == "keys: answer,boxed,finish_reason,model,parsed,role,text,tokens,truncated"  # no engine keys
    rewards = con.execute("SELECT name, turn_index FROM rewards ORDER BY turn_index").fetchall()
    assert rewards == [("first", 1), ("second", 3)]  # the turns whose replies r and s hold


def test_a_reply_keeps_its_attributes_when_copied_or_pickled():
    r = Reply({"text": "x", "answer": "7"}, turn=3, missing=["answer"])
    for other in (copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert other == {"text": "x", "answer": "7"} and (other.turn, other.missing) == (3, ["answer"])
