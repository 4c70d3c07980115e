"""The interpreter's protocol semantics, run in-process on Python-backed fake models:
memory policies, parallel fan-out, `sample N`, bounded loops, per-turn rewards, group
routing to tournaments, and faults recorded on the session while the run goes on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import fake_models

from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store


def run(tmp_path: Path, spec: str, expect_rc: int = 0, **options):
    path = tmp_path / "t.ask"
    path.write_text(spec)
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), **{"eval_only": True, **options}))
    assert rc == expect_rc
    return open_store(run_dir)


def prompts(con, role: str, session: str = "s000000") -> list[list[dict]]:
    rows = con.execute(f"select prompt from turns where role='{role}' and session_id='{session}' order by turn_index").fetchall()
    return [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in rows]


MEMORY = """
model echo = python("fake_models:count_messages")
role full_r { model = echo; memory = full; system = "sys"; prompt = "go {{ turn }}" }
role none_r { model = echo; memory = none; system = "sys"; prompt = "go {{ turn }}" }
role win_r { model = echo; memory = window(1); system = "sys"; prompt = "go {{ turn }}" }
game g {
    repeat 3 {
        ask full_r
        ask none_r
        ask win_r
    }
}
"""


def test_memory_policies(tmp_path):
    con = run(tmp_path, MEMORY)
    assert [len(p) for p in prompts(con, "full_r")] == [2, 4, 6]  # system + all earlier exchanges
    assert [len(p) for p in prompts(con, "none_r")] == [2, 2, 2]  # system + the current message only
    assert [len(p) for p in prompts(con, "win_r")] == [2, 4, 4]  # system + the last exchange
    full = prompts(con, "full_r")[-1]
    assert [m["role"] for m in full] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert full[-1]["content"] == "go 3"


def test_model_output_is_never_rendered_as_a_template(tmp_path):
    spec = """
model m = python("fake_models:count_messages")
role a { model = m; memory = none; prompt = "{{ message }}" }
game g {
    x = ask a: "{{ 7 * 7 }} {% for i in range(3) %}x{% endfor %}"
}
"""
    con = run(tmp_path, spec)
    sent = prompts(con, "a")[0][-1]["content"]
    assert sent == "{{ 7 * 7 }} {% for i in range(3) %}x{% endfor %}"


FANOUT = """
model slow = python("fake_models:slow_tracked")
role a { model = slow; memory = none; reply = sections("#Answer#"); prompt = "q" }
role b { model = slow; memory = none; reply = sections("#Answer#"); prompt = "q" }
game g {
    outcomes done
    ra, rb = ask a, b
    many = sample 4 ask a
    for r in many { reward r as each = 1 }
    reward a = len(many)
    outcome = done
}
"""


def test_parallel_fanout_and_sample(tmp_path):
    fake_models.IN_FLIGHT.update(now=0, max=0)
    con = run(tmp_path, FANOUT, concurrency=1)
    # with one session in flight, only the fan-out and the sample can overlap calls
    assert fake_models.IN_FLIGHT["max"] >= 2
    assert con.execute("select count(*) from turns where role='a'").fetchone()[0] == 5
    rewards = con.execute("select name, turn_index, value from rewards order by name, turn_index").fetchall()
    each = [r for r in rewards if r[0] == "each"]
    assert len(each) == 4 and all(r[1] is not None for r in each)  # per-turn rewards carry their turn
    assert ("reward", None, 4.0) in rewards  # terminal reward: turn_index NULL


BACKWARDS = """
model late = python("fake_models:finishes_backwards")
role a { model = late; memory = none; reply = sections("#Answer#"); prompt = "q" }
role b { model = late; memory = none; reply = sections("#Answer#"); prompt = "q" }
game g {
    ra, rb = ask a, b
    many = sample 4 ask b
}
"""


def test_turns_are_numbered_in_the_order_asked_not_answered(tmp_path):
    """`ask a, b` numbers a's turn before b's and `sample 4` its samples in order, though
    the replies arrive the other way round (b first, the last sample first): the same
    spec and seed give the same turn numbers whichever backend answers first."""
    con = run(tmp_path, BACKWARDS, concurrency=1)
    rows = con.execute("select turn_index, role, text from turns order by turn_index").fetchall()
    assert [(i, role) for i, role, _ in rows] == [(0, "a"), (1, "b"), (2, "b"), (3, "b"), (4, "b"), (5, "b")]
    assert [text for _, _, text in rows] == ["#Answer# a-0", "#Answer# b-0", "#Answer# b-1", "#Answer# b-2",
                                           "#Answer# b-3", "#Answer# b-4"]


LOOPS = """
model m = python("fake_models:count_messages")
role a { model = m; memory = none; prompt = "q" }
game g {
    k = 0
    while k < 10 limit 4 { ask a; k = k + 1 }
    j = 0
    until j >= 2 limit 5 { ask a; j = j + 1 }
    for x in [1, 2, 3] { ask a }
}
"""


def test_bounded_loops(tmp_path):
    con = run(tmp_path, LOOPS)
    assert con.execute("select count(*) from turns").fetchone()[0] == 4 + 2 + 3


ARENA = """
experiment arena { param group: int = 8 }
model policy_m = python("fake_models:{policy}")
model judge_m = python("fake_models:judge_first")
role policy {{ model = policy_m; trained; memory = none; reply = boxed; prompt = "solve" }}
role judge {{ model = judge_m; memory = none }}
tournament cup {{ judge = judge; prompt = "A: {{{{ response_a }}}} B: {{{{ response_b }}}}"; pairing = {pairing}; gamma = 0.9 }}
game solve sample group {{
    r = ask policy
    reward policy = case {{ r.answer == "1" -> 1.0; else -> 0.0 }}
    route policy {{ when var(rewards) > 0 -> keep; else -> tournament cup }}
}}
"""


def _arena(tmp_path, policy: str, pairing: str):
    spec = ARENA.replace("{policy}", policy).replace("{pairing}", pairing).replace("{{", "{").replace("}}", "}")
    return run(tmp_path, spec)


@pytest.mark.parametrize("pairing, calls", [("round_robin", 28), ("live", 18)])
def test_equal_group_goes_to_tournament(tmp_path, pairing, calls):
    con = _arena(tmp_path, "always_one", pairing)
    assert con.execute("select count(*) from matches").fetchone()[0] == calls
    route = con.execute("select route from groups").fetchone()[0]
    assert route == "tournament:cup"
    scores = [r[0] for r in con.execute("select value from rewards where name='tournament'").fetchall()]
    assert len(scores) == 8 and all(0.0 <= s <= 1.0 for s in scores)


def test_diverse_group_makes_no_judge_calls(tmp_path):
    con = _arena(tmp_path, "session_answer", "round_robin")
    assert con.execute("select count(*) from matches").fetchone()[0] == 0
    assert con.execute("select route from groups").fetchone()[0] == "keep"
    assert con.execute("select count(*) from rewards where name='tournament'").fetchone()[0] == 0


def test_failing_model_marks_session_error_and_run_goes_on(tmp_path):
    spec = """
model ok_m = python("fake_models:always_one")
model bad_m = python("fake_models:fails")
role a { model = ok_m; memory = none; prompt = "q" }
role b { model = bad_m; memory = none; prompt = "q" }
game g for i in [1, 2, 3] {
    x = ask a
    if i == 2 { y = ask b }
}
"""
    con = run(tmp_path, spec)
    rows = con.execute("select session_id, status, error from sessions order by session_id").fetchall()
    assert [r[1] for r in rows] == ["ok", "error", "ok"]
    assert "fake model is down" in rows[1][2]


def test_template_sandbox_blocks_unsafe_access(tmp_path):
    # visible in the template's text: refused by check (E305), no run starts
    path = tmp_path / "static.ask"
    path.write_text("""
model m = python("fake_models:count_messages")
role a { model = m; memory = none; prompt = "{{ message.__class__.__mro__ }}" }
game g { x = ask a: "hello" }
""")
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "static-runs")))
    assert rc == 1 and run_dir is None
    # built at run time: the sandbox refuses it when rendering, the session records why
    spec = """
model m = python("fake_models:count_messages")
role a { model = m; memory = none; prompt = "{{ role | attr(message) }}" }
game g { x = ask a: "__class__" }
"""
    con = run(tmp_path, spec, expect_rc=3)  # its only session failed
    status, error = con.execute("select status, error from sessions").fetchone()
    assert status == "error" and "template" in error and "unsafe" in error
    assert con.execute("select count(*) from turns").fetchone()[0] == 0


BUFFERS = """
buffer kept { capacity = 3; fields = {q: number} }
model m = python("fake_models:always_one")
role a { model = m; memory = none; reply = boxed }
game fill for i in [1, 2, 3, 4, 5] {
    r = ask a using "{{ i }}"
    push kept: {q: i}
    if i == 2 { drop r }
}
game replay for item in kept {
    r = ask a using "{{ item.q }}"
    seen = item.q
}
"""


def test_push_fills_buffer_then_replay_phase(tmp_path):
    con = run(tmp_path, BUFFERS)
    rows = con.execute("select session_id, game, params, vars, bookkeeping from sessions order by session_id").fetchall()
    assert [r[1] for r in rows] == ["fill"] * 5 + ["replay"] * 3
    # capacity 3, oldest out: the replay phase sees the last three pushes, in session order
    seen = [json.loads(r[3])["seen"] for r in rows[5:]]
    assert seen == [3, 4, 5]
    # the engine's bookkeeping has a column of its own; `vars` holds the spec's variables only
    book = json.loads(rows[1][4])
    assert book["dropped"] == [{"role": "a", "turns": [0]}] and book["pushes"] == [["kept", {"q": 2}]]
    assert all(not k.startswith("__") for r in rows for k in json.loads(r[3]))
    assert rows[5][4] is None  # a replay session pushes, drops and scores nothing


def test_tournament_strengths_are_stored_with_the_group(tmp_path):
    con = _arena(tmp_path, "always_one", "live")
    stats = json.loads(con.execute("select stats from groups").fetchone()[0])
    assert len(stats["strengths"]) == 8 and stats["judge_calls"] == 18
    assert stats["aggregate"] == "bradley_terry" and stats["var"] == 0


def test_metrics_filter_sessions_and_skip_games_without_the_variable(tmp_path):
    from askspec.runtime.engine.metrics import run_metrics

    spec = """
model m = python("fake_models:always_one")
role a { model = m; memory = none; reply = boxed; prompt = "q" }
game scored for i in [1, 2, 3, 4] {
    r = ask a
    score = i * 10
}
game plain { r = ask a }
metric mean_score = mean(score)
metric mean_big = mean(score where score > 15)
metric n_sessions = count(status)
"""
    path = tmp_path / "m.ask"
    path.write_text(spec)
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True))
    assert rc == 0
    rows, errors = run_metrics(run_dir)
    values = {r["metric"]: r["value"] for r in rows}
    assert errors == 0
    assert values["mean_score"] == pytest.approx(25.0)  # the `plain` session defines no score
    assert values["mean_big"] == pytest.approx(30.0)
    assert values["n_sessions"] == 5


def test_pointwise_judge_route_scores_each_trace(tmp_path):
    spec = """
experiment pw { param group: int = 4 }
model policy_m = python("fake_models:always_one")
model judge_m = python("fake_models:always_one")
role policy { model = policy_m; trained; memory = none; reply = boxed; prompt = "solve" }
role judge { model = judge_m; memory = none }
judge grade { judge = judge; prompt = "Grade: {{ response }}" }
game solve sample group {
    r = ask policy
    reward policy = 1.0
    route policy { when var(rewards) > 0 -> keep; else -> judge grade }
}
"""
    con = run(tmp_path, spec)
    assert con.execute("select route from groups").fetchone()[0] == "judge:grade"
    stats = json.loads(con.execute("select stats from groups").fetchone()[0])
    assert stats["judge_calls"] == 4 and len(stats["judge_replies"]) == 4
    assert [r[0] for r in con.execute("select value from rewards where name='judge'").fetchall()] == [1.0] * 4


def test_a_failing_route_is_recorded_on_its_group(tmp_path):
    spec = """
experiment bad_route { param group: int = 2 }
model m = python("fake_models:always_one")
model down = python("fake_models:fails")
role policy { model = m; trained; memory = none; reply = boxed; prompt = "solve" }
role judge { model = down; memory = none }
tournament cup { judge = judge; prompt = "{{ response_a }} {{ response_b }}"; pairing = round_robin; gamma = 1.0 }
game solve sample group {
    r = ask policy
    reward policy = 1.0
    route policy { when var(rewards) > 0 -> keep; else -> tournament cup }
}
"""
    con = run(tmp_path, spec)  # the run itself finishes (exit 0)
    route, stats = con.execute("select route, stats from groups").fetchone()
    assert route == "error" and "fake model is down" in json.loads(stats)["error"]
    assert [r[0] for r in con.execute("select status from sessions").fetchall()] == ["ok", "ok"]
