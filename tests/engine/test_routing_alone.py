"""Group routing tested alone: no engine, no backend, no store. A fake judge client
(named as such) answers with scripted replies and a list stands in for the run writer."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from askspec.lang.compiler import compile_source
from askspec.runtime.backends.base import BackendError
from askspec.runtime.engine.plan import SessionPlan
from askspec.runtime.engine.routing import GroupRouter, JudgeReply
from askspec.runtime.engine.state import SessionResult

SPEC = """
experiment r { param group: int = 4 }
model m = python("fake_models:always_one")
role policy { model = m; trained; memory = none; reply = boxed; prompt = "solve" }
role judge { model = m; memory = none }
tournament cup { judge = judge; prompt = "A: {{ response_a }} B: {{ response_b }}"; pairing = round_robin; gamma = 1.0; order = fixed }
judge grade { judge = judge; prompt = "Grade: {{ response }}"; retries = 1 }
game solve sample group {
    r = ask policy
    reward policy = 1.0
    route policy { when var(rewards) > 0 -> keep; when size == 3 -> judge grade; else -> tournament cup }
}
"""


class FakeJudgeClient:
    """Renders by formatting the context and answers from a script (a function of the prompt)."""

    def __init__(self, answer: Callable[[str], str]) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, int]] = []

    def render(self, template: str, ctx: dict[str, Any]) -> str:
        if "response_a" in ctx:
            return f"A: {ctx['response_a']} B: {ctx['response_b']}"
        return f"Grade: {ctx['response']}"

    async def call(self, role: str, prompt: str, parse, *, group_id: str, session_index: int, call_index: int) -> JudgeReply:
        self.calls.append((role, prompt, call_index))
        text = self.answer(prompt)
        return JudgeReply(text, parse(text))


class ListRecorder:
    """Keeps what routing records, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def __getattr__(self, name: str):
        def record(*args, **kwargs):
            self.events.append((name, {"args": args, **kwargs}))

        return record

    def of(self, name: str) -> list[dict]:
        return [e for n, e in self.events if n == name]


def members(n: int, rewards: list[float], texts: list[str]) -> list[SessionResult]:
    return [SessionResult(plan=SessionPlan(index=i, session_id=f"s{i}", game="solve", group_id="g", group_size=n,
                                           bindings={}, seed=i),
                          status="ok", rewards=[("policy", None, "r", rewards[i])], final_texts={"policy": texts[i]})
            for i in range(n)]


def router(answer: Callable[[str], str]) -> tuple[GroupRouter, FakeJudgeClient, ListRecorder]:
    res = compile_source("r.ask", SPEC, {})
    assert res.ok, [d.message for d in res.sink.items]
    client, rec = FakeJudgeClient(answer), ListRecorder()
    return GroupRouter(res.ir, res.ir.param_values(), 0, rec, client), client, rec


def test_a_diverse_group_keeps_its_rewards_without_judge_calls():
    r, client, rec = router(lambda p: "\\boxed{A}")
    tallies = asyncio.run(r.route("g", members(4, [1, 0, 1, 0], ["a", "b", "c", "d"])))
    assert tallies == [] and client.calls == []
    (group,) = rec.of("group")
    assert group["route"] == "keep" and group["stats"]["var"] == 0.25 and "judge_calls" not in group


def test_a_tournament_scores_traces_from_the_judges_verdicts():
    # the judge prefers the trace that says "best"
    r, client, rec = router(lambda p: "\\boxed{A}" if p.startswith("A: best") else "\\boxed{B}" if "B: best" in p else "\\boxed{Tie}")
    (tally,) = asyncio.run(r.route("g", members(4, [1] * 4, ["best", "x", "y", "z"])))
    assert (tally.contest, tally.judge, tally.calls, tally.unparsed) == ("tournament cup", "judge", 6, 0)
    assert [c[2] for c in client.calls] == list(range(6))  # call numbers seed the calls
    rewards = {e["args"][0]: e["value"] for e in rec.of("reward")}
    # win rates: best beats all three; the others lose to it and tie with each other
    assert rewards["s0"] == 1.0 and rewards["s1"] == rewards["s2"] == rewards["s3"] == pytest.approx(1 / 3)
    (group,) = rec.of("group")
    assert group["route"] == "tournament:cup" and (group["judge_calls"], group["unparsed"]) == (6, 0)
    assert len(rec.of("match")) == 6


def test_unparsed_verdicts_are_counted_on_the_group():
    r, _, rec = router(lambda p: "no verdict here")
    (tally,) = asyncio.run(r.route("g", members(4, [1] * 4, ["a", "b", "c", "d"])))
    assert tally.failing and (tally.calls, tally.unparsed) == (18, 18)  # 6 matches x (1 + 2 retries)
    (group,) = rec.of("group")
    assert (group["judge_calls"], group["unparsed"]) == (18, 18)
    assert rec.of("reward")  # every match skipped: the tournament still assigns (equal) scores


def test_pointwise_judge_retries_and_counts():
    replies = iter(["hmm", "\\boxed{1}", "\\boxed{0.5}", "\\boxed{7}", "\\boxed{0}"])
    r, _, rec = router(lambda p: next(replies))
    (tally,) = asyncio.run(r.route("g", members(3, [1] * 3, ["a", "b", "c"])))
    assert (tally.contest, tally.calls, tally.unparsed) == ("judge grade", 5, 2)
    assert [e["value"] for e in rec.of("reward")] == [1.0, 0.5, 0.0]
    assert rec.of("group")[0]["stats"]["judge_replies"] == [["hmm", "\\boxed{1}"], ["\\boxed{0.5}"], ["\\boxed{7}", "\\boxed{0}"]]


def test_a_judge_that_is_down_marks_the_route_error_with_its_counts():
    def down(prompt: str) -> str:
        raise BackendError("judge server unreachable")

    r, _, rec = router(down)
    (tally,) = asyncio.run(r.route("g", members(4, [1] * 4, ["a", "b", "c", "d"])))
    (group,) = rec.of("group")
    assert group["route"] == "error" and "unreachable" in group["stats"]["error"]
    assert group["unparsed"] == group["judge_calls"] >= 1 and tally.failing


def test_routing_needs_no_engine():
    import ast
    from pathlib import Path

    import askspec.runtime.engine.routing as routing

    tree = ast.parse(Path(routing.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "askspec.runtime.engine.session" not in imported


def test_a_live_tournament_takes_the_traces_in_finish_order():
    # Reasoning Arena §4: a trace enters the live tournament when it finishes, the short
    # ones first; the finish order is the completion token count (ties: sample order)
    spec = SPEC.replace("pairing = round_robin; gamma = 1.0", "pairing = live(best, worst, median); gamma = 1.0; "
                        "aggregate = bradley_terry")
    res = compile_source("r.ask", spec, {})
    assert res.ok, [d.message for d in res.sink.items]
    client = FakeJudgeClient(lambda p: "\\boxed{A}" if p.startswith("A: best") else
                             "\\boxed{B}" if "B: best" in p else "\\boxed{Tie}")
    rec = ListRecorder()
    r = GroupRouter(res.ir, res.ir.param_values(), 0, rec, client)
    group = members(4, [1] * 4, ["w", "x", "y", "best"])
    for m, tokens in zip(group, [30, 10, 30, 40]):
        m.tokens = tokens
    (tally,) = asyncio.run(r.route("g", group))
    (g,) = rec.of("group")
    assert g["stats"]["arrival"] == ["s1", "s0", "s2", "s3"]
    # arrival k meets min(k - 1, 3) traces already arrived: 0 + 1 + 2 + 3 calls
    assert tally.calls == 6
    seen = [{t for t in ("w", "x", "y", "best") if f" {t} " in f" {c[1]} "} for c in client.calls]
    assert seen[0] == {"x", "w"} and all("best" in s for s in seen[3:]) and not any("best" in s for s in seen[:3])
    # the scores go back to the members (sample order): the longest, last-arrived trace wins
    rewards = {e["args"][0]: e["value"] for e in rec.of("reward")}
    assert rewards["s3"] == 1.0 and max(rewards[s] for s in ("s0", "s1", "s2")) < 1.0
    pairs = [frozenset((m["a"], m["b"])) for m in rec.of("match")]
    assert pairs[0] == {"s0", "s1"} and {p for p in pairs if "s3" in p} == {frozenset(("s3", s)) for s in ("s0", "s1", "s2")}
