"""Every model call is a turn: a Reasoning Arena group's judge calls are recorded as
turns of the judge role with their group, the group counts the calls that gave no
parseable verdict, and a judge that fails most of its calls is warned about on the
console and in the run summary."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

ARENA = Path(__file__).resolve().parents[2] / "specs" / "reasoning_arena.ask"


def arena(tmp_path: Path, judge: str, sessions: int = 4):
    # groups of 4 identical traces: not diverse, so the live tournament judges them
    # (6 matches; a match without a verdict is retried twice)
    rc, run_dir = asyncio.run(run_spec(str(ARENA), eval_only=True, out=str(tmp_path), sessions=sessions, set=["group_size=4"],
                                       model=["policy=python:fake_models:always_one", f"judge=python:fake_models:{judge}"]))
    assert rc == 0
    return open_store(run_dir)


def test_a_judge_that_never_parses_is_recorded_and_warned_about(tmp_path, capsys):
    con = arena(tmp_path, "judge_rambles")
    err = capsys.readouterr().err
    group_id, route, calls, unparsed = con.execute("select group_id, route, judge_calls, unparsed from groups").fetchone()
    assert route == "tournament:arena" and (calls, unparsed) == (18, 18)
    turns = con.execute("select session_id, group_id, turn_index, parsed, prompt from turns where role = 'judge' "
                        "order by turn_index").fetchall()
    assert len(turns) == 18
    assert {(t[0], t[1]) for t in turns} == {(group_id, group_id)}  # the group's id stands for the session
    assert [t[2] for t in turns] == list(range(18))
    assert all(json.loads(t[3]) == {"verdict": None, "parsed": False} for t in turns)
    assert "[RESPONSE A]\n\n\\boxed{1}" in json.loads(turns[0][4])[-1]["content"]  # the rendered tournament prompt
    # the players' turns are untouched: one per session, no group id
    assert con.execute("select count(*), count(group_id) from turns where role = 'policy'").fetchone() == (4, 0)
    assert con.execute("select count(*) from sessions").fetchone()[0] == 4
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, err  # once when it happens, once in the run summary
    assert all("judge 'judge' gave no parseable verdict in 18 of 18 calls" in w for w in warnings)
    assert "tournament arena" in warnings[-1] and "whole run" in warnings[-1]


def test_a_judge_that_parses_is_recorded_without_a_warning(tmp_path, capsys):
    con = arena(tmp_path, "judge_first")
    assert con.execute("select judge_calls, unparsed from groups").fetchone() == (6, 0)
    parsed = [json.loads(r[0]) for r in con.execute("select parsed from turns where role = 'judge'").fetchall()]
    assert parsed == [{"verdict": "A", "parsed": True}] * 6
    assert con.execute("select count(*) from matches").fetchone()[0] == 6
    assert "warning:" not in capsys.readouterr().err


def test_a_judge_that_starts_failing_later_is_warned_about(tmp_path, capsys):
    con = arena(tmp_path, "judge_fails_later", sessions=8)
    groups = con.execute("select judge_calls, unparsed from groups order by group_id").fetchall()
    assert groups == [(6, 0), (18, 18)]
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "in 18 of 18 calls" in warnings[0] and "in 18 of 24 calls, over the whole run" in warnings[1]


def test_a_group_routed_again_after_a_resume_keeps_only_the_new_judge_turns(tmp_path):
    from askspec.runtime.store.writer import RunWriter

    def judge_turn(w, group_id: str, i: int, text: str) -> None:
        w.turn(group_id, 1, turn_index=i, role="judge", model="m", prompt=[], text=text, parsed={"parsed": False},
               finish_reason="stop", tokens_in=1, tokens_out=1, latency_ms=1.0, group_id=group_id)

    w = RunWriter.create(tmp_path, experiment="x", experiment_hash="h", ir_json="{}", spec_files={}, seed=0,
                         roles={}, params={}, planned_sessions=2, argv=[])
    judge_turn(w, "g1", 0, "old g1")  # the process dies before g1's route is recorded
    judge_turn(w, "g2", 0, "g2")
    w.group("g2", route="judge:j", stats={}, members=[], judge_calls=1, unparsed=1)
    w.close()
    w = RunWriter.open_for_resume(w.run_dir)
    judge_turn(w, "g1", 0, "new g1")
    w.group("g1", route="judge:j", stats={}, members=[], judge_calls=1, unparsed=1)
    w.finish()
    con = open_store(w.run_dir)
    assert con.execute("select group_id, text from turns order by group_id").fetchall() == [("g1", "new g1"), ("g2", "g2")]
