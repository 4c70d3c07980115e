"""One reward rule (askspec.ir.vocab.reward_counts): a role's final reward is its per-turn
rewards plus the terminal ones that count, a contest's replacing the others where the
session's group was routed to a contest for that role. Its SQL form (the TUI's
FINAL_REWARDS), `askspec metrics`' group values, the Inspect export and the TUI's group
view all give the same finals on random sessions."""

from __future__ import annotations

import json
import random

import duckdb
import pytest

from askspec.ir.vocab import CONTEST_ROUTES, reward_counts
from askspec.runtime.commands.inspect_log import session_finals
from askspec.ir.advantages import group_std
from askspec.runtime.engine.metrics import ADVANTAGE_EPS, group_values
from askspec.tui.data import FINAL_REWARDS
from askspec.tui.shaping import build_group

ROLES = ["a", "b"]
NAMES = ["correct", "format", *CONTEST_ROUTES]


def case(seed: int) -> tuple[str, str | None, dict[str, list[dict]]]:
    """(route, the role it was routed for, session -> its reward rows)."""
    rng = random.Random(seed)
    route = rng.choice(["keep", "tournament", "judge:pointwise", "none"])
    role = rng.choice(ROLES) if route != "none" else None
    sessions = {}
    for s in range(rng.randint(1, 4)):
        sessions[f"s{s}"] = [{"session_id": f"s{s}", "role": rng.choice(ROLES), "name": rng.choice(NAMES),
                              "turn_index": rng.choice([None, None, 0, 1]), "value": float(rng.randint(-3, 3))}
                             for _ in range(rng.randint(0, 6))]
    return route, role, sessions


def by_rule(route: str, role: str | None, rows: list[dict]) -> dict[str, float]:
    routed = route.split(":", 1)[0] in CONTEST_ROUTES
    out: dict[str, float] = {}
    for r in rows:
        out.setdefault(r["role"], 0.0)
        if reward_counts(r["turn_index"], r["name"], routed and r["role"] == role):
            out[r["role"]] += r["value"]
    return out


@pytest.mark.parametrize("seed", range(60))
def test_every_reader_counts_as_the_rule(seed):
    route, role, sessions = case(seed)
    stats = {"role": role} if role else {}
    group = {"group_id": "g", "route": route, "stats": stats, "members": list(sessions)}
    expected = {sid: by_rule(route, role, rows) for sid, rows in sessions.items()}

    # the Inspect export
    for sid, rows in sessions.items():
        assert session_finals(rows, {"route": route, "stats": stats})[0] == expected[sid]

    # the TUI's SQL
    con = duckdb.connect()
    con.execute("CREATE TABLE rewards (run_id VARCHAR, session_id VARCHAR, role VARCHAR, turn_index INTEGER, "
                "name VARCHAR, value DOUBLE)")
    con.execute("CREATE TABLE sessions (run_id VARCHAR, session_id VARCHAR, group_id VARCHAR)")
    con.execute("CREATE TABLE groups (run_id VARCHAR, group_id VARCHAR, route VARCHAR, stats JSON)")
    con.execute("INSERT INTO groups VALUES ('r', 'g', ?, ?)", [route, json.dumps(stats)])
    for sid, rows in sessions.items():
        con.execute("INSERT INTO sessions VALUES ('r', ?, 'g')", [sid])
        for r in rows:
            con.execute("INSERT INTO rewards VALUES ('r', ?, ?, ?, ?, ?)",
                        [sid, r["role"], r["turn_index"], r["name"], r["value"]])
    sql = {(sid, rl): total for _, sid, rl, total in con.execute(FINAL_REWARDS).fetchall()}
    for sid, finals in expected.items():
        for rl, v in finals.items():
            # a role whose every reward is left out has no row there (0 where it shows)
            assert sql.get((sid, rl), 0.0) == pytest.approx(v), (sid, rl)

    # `askspec metrics`' group values: the group's role's finals, centred
    if role is not None:
        named = {sid: [(r["role"], r["turn_index"], r["name"], r["value"]) for r in rows]
                 for sid, rows in sessions.items()}
        values = group_values(route, stats, list(sessions), 0, lambda sid: named[sid])
        finals = [expected[sid].get(role, 0.0) for sid in sessions]
        mean, std = sum(finals) / len(finals), group_std(finals, "population")
        for sid, f in zip(sessions, finals):
            centred = f - mean if abs(f - mean) > 1e-12 else 0.0
            assert values[sid]["advantage"] == pytest.approx(centred / (std + ADVANTAGE_EPS)), sid

    # the TUI's group view
    all_rows = [r for rows in sessions.values() for r in rows]
    detail = build_group(group, [], all_rows, None, {}, trained=ROLES)
    table = detail.members.to_pydict()
    shown = [c for c in table if c.startswith("final")]
    assert shown
    for column in shown:
        rl = column.split(" ", 1)[1] if " " in column else (role or next(iter({r["role"] for r in all_rows})))
        for sid, v in zip(table["session"], table[column]):
            if v is not None:  # None: no reward of the role in that session
                assert v == pytest.approx(expected[sid].get(rl, 0.0)), (column, sid)
