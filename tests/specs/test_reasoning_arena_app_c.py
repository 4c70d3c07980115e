"""Reasoning Arena's worked example (reasoning_arena.txt App. C, issue 15 item 6) replayed
through specs/reasoning_arena.ask: the paper's two groups (all correct, all incorrect),
its responses and its judge's verdicts, on the replay backend. Each group is non-diverse,
so the route sends it to the live tournament; the judge sees the paper's Response A as
"Response A"; and the tournament rewards the trace the paper's judge preferred (A in the
all-correct group, B in the all-incorrect one) with 1 and the other with 0."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

ROOT = Path(__file__).resolve().parents[2]
APP_C = json.loads((Path(__file__).parent / "fixtures" / "reasoning_arena_app_c.json").read_text(encoding="utf-8"))
GROUPS = ("all_correct", "all_incorrect")
PREFERRED = {"all_correct": "a", "all_incorrect": "b"}  # the paper's verdicts: \boxed{A}, \boxed{B}
# Which session of its group carries the paper's Response A, so that the seeded random
# presentation order (order debiasing, §4) shows it first; the test checks the prompt.
A_SESSION = {"all_correct": 0, "all_incorrect": 1}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("appc")
    spec_dir = tmp / "specs"
    (spec_dir / "data").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "reasoning_arena.ask", spec_dir)
    shutil.copytree(ROOT / "specs" / "prompts" / "reasoning_arena", spec_dir / "prompts" / "reasoning_arena")
    rows = [{"id": g, "template": "app_c", "split": "train", "question": APP_C[g]["problem"], "answer": APP_C[g]["reference"]}
            for g in GROUPS]
    (spec_dir / "data" / "math_problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sessions = []
    for g in GROUPS:
        texts = [APP_C[g]["response_b"], APP_C[g]["response_b"]]
        texts[A_SESSION[g]] = APP_C[g]["response_a"]
        texts[1 - A_SESSION[g]] = APP_C[g]["response_b"]
        sessions += [{"policy": [texts[0]], "judge": [APP_C[g]["verdict"]]}, {"policy": [texts[1]], "judge": []}]
    replay = tmp / "app_c.json"
    replay.write_text(json.dumps({"sessions": sessions}))
    rc, run_dir = asyncio.run(run_spec(str(spec_dir / "reasoning_arena.ask"), eval_only=True, out=str(tmp / "runs"),
                                       replay=str(replay), set=["group_size=2"], quiet=True))
    assert rc == 0
    return open_store(run_dir)


def _member(k: int, g: str) -> str:
    return f"s{2 * GROUPS.index(g) + k:06d}"


def test_both_groups_are_non_diverse_and_go_to_the_tournament(run):
    solved = dict(run.execute("select session_id, json_extract(vars, '$.solved') from sessions").fetchall())
    assert [json.loads(solved[_member(k, "all_correct")]) for k in (0, 1)] == [True, True]
    assert [json.loads(solved[_member(k, "all_incorrect")]) for k in (0, 1)] == [False, False]
    routes = [r for (r,) in run.execute("select route from groups order by group_id").fetchall()]
    assert routes == ["tournament:arena", "tournament:arena"]


@pytest.mark.parametrize("g", GROUPS)
def test_the_judge_sees_the_papers_pair_and_its_verdict_decides(run, g):
    first = _member(0, g)
    (prompt, parsed), = run.execute(
        "select t.prompt, t.parsed from turns t join sessions s on t.group_id = s.group_id "
        f"where t.role = 'judge' and s.session_id = '{first}'").fetchall()
    text = json.loads(prompt)[-1]["content"]
    shown_a = text[text.index("[RESPONSE A]"):text.index("[RESPONSE B]")]
    assert APP_C[g]["response_a"] in shown_a  # the paper's Response A is shown as Response A
    assert f"The correct answer is: {APP_C[g]['reference']}" in text
    assert json.loads(parsed)["verdict"] == PREFERRED[g].upper()
    rewards = dict(run.execute("select session_id, value from rewards where name = 'tournament'").fetchall())
    a_sid, b_sid = _member(A_SESSION[g], g), _member(1 - A_SESSION[g], g)
    winner, loser = (a_sid, b_sid) if PREFERRED[g] == "a" else (b_sid, a_sid)
    assert (rewards[winner], rewards[loser]) == (1.0, 0.0)  # the published outcome
