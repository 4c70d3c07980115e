"""Trajectories, rewards and groups from a step's sessions (runtime/train/batch.py): how
per-turn and terminal rewards combine, what routes and drops exclude."""

from __future__ import annotations

import pytest

from askspec.runtime.train.batch import SessionRecord, build_batch


def roll(role, turn, sample=None, n=3):
    return {"role": role, "turn_index": turn, "sample_key": sample, "prompt_ids": [1, 2], "completion_ids": list(range(n)),
            "logprobs": [-0.1] * n, "temperature": 1.0, "finish_reason": "stop"}


def session(sid, rollouts, rewards, group=None, status="ok", dropped=None):
    return SessionRecord(sid, group, 1, status, {}, {"dropped": dropped} if dropped else {}, rewards, rollouts)


def by_key(batch):
    return {t.key: t for t in batch.trajectories}


def test_a_conversation_sums_its_terminal_and_per_turn_rewards():
    s = session("s1", [roll("q", 0), roll("b", 1), roll("q", 2)],
                [("q", None, "calibration", 1.0), ("q", 0, "shaping", 0.25), ("q", 2, "shaping", -0.5), ("b", None, "x", 9.0)],
                group="g1")
    t = by_key(build_batch("q", [s], {}))["s1/q"]
    assert t.reward == pytest.approx(1.0 + 0.25 - 0.5)
    assert [turn.turn_index for turn in t.turns] == [0, 2]  # the other role's turn is context, not trained
    assert t.group_key == "g1"


def test_sample_replies_are_single_turn_trajectories_grouped_by_their_ask():
    s = session("s1", [roll("p", 0, "x0.0"), roll("p", 1, "x0.1"), roll("p", 2, "x1.0"), roll("p", 3, "x1.1")],
                [("p", 0, "r", 1.0), ("p", 1, "r", 0.0), ("p", 2, "r", 0.5), ("p", 3, "r", 0.5), ("p", None, "bonus", 2.0)])
    ts = by_key(build_batch("p", [s], {}))
    assert set(ts) == {"s1/p/x0.0", "s1/p/x0.1", "s1/p/x1.0", "s1/p/x1.1"}
    assert ts["s1/p/x0.0"].group_key == ts["s1/p/x0.1"].group_key != ts["s1/p/x1.0"].group_key
    # no conversation turns: the session's terminal reward goes to every sample
    assert [ts[k].reward for k in sorted(ts)] == [3.0, 2.0, 2.5, 2.5]


def test_terminal_rewards_go_to_the_conversation_when_there_is_one():
    s = session("s1", [roll("p", 0), roll("p", 1, "x0.0")], [("p", None, "t", 1.0), ("p", 1, "r", 0.5)])
    ts = by_key(build_batch("p", [s], {}))
    assert ts["s1/p"].reward == 1.0 and ts["s1/p/x0.0"].reward == 0.5


def test_a_routed_group_uses_the_contest_reward_instead_of_the_verifier():
    s = session("s1", [roll("pol", 0)], [("pol", None, "verifier", 1.0), ("pol", None, "tournament", 0.25)], group="g")
    assert build_batch("pol", [s], {("g", "pol"): "tournament:arena"}).trajectories[0].reward == 0.25
    assert build_batch("pol", [s], {("g", "pol"): "keep"}).trajectories[0].reward == 1.0


def test_dropped_groups_sessions_and_turns_are_excluded():
    rs = [("a", None, "r", 1.0)]
    batch = build_batch("a", [session("s1", [roll("a", 0)], rs, group="g")], {("g", "a"): "drop"})
    assert batch.trajectories == [] and batch.excluded["dropped_groups"] == 1
    batch = build_batch("a", [session("s1", [roll("a", 0)], rs, dropped=[{"role": "a", "turns": None}])], {})
    assert batch.trajectories == [] and batch.excluded["dropped_sessions"] == 1
    s = session("s1", [roll("a", 0, "x0.0"), roll("a", 1, "x0.1")], [("a", 0, "r", 1.0), ("a", 1, "r", 0.0)],
                dropped=[{"role": "a", "turns": [1]}])
    batch = build_batch("a", [s], {})
    assert [t.key for t in batch.trajectories] == ["s1/a/x0.0"] and batch.excluded["dropped_turns"] == 1
    batch = build_batch("a", [session("s1", [roll("a", 0)], rs, status="error")], {})
    assert batch.trajectories == [] and batch.excluded["error_sessions"] == 1
    batch = build_batch("a", [session("s1", [roll("a", 0)], rs, group="g")], {("g", "*"): "error"})
    assert batch.trajectories == [] and batch.excluded["dropped_groups"] == 1


def test_unrewarded_trajectories_are_excluded_except_for_sft():
    s = session("s1", [roll("a", 0)], [])
    assert build_batch("a", [s], {}).excluded["unrewarded"] == 1
    assert len(build_batch("a", [s], {}, need_reward=False).trajectories) == 1
