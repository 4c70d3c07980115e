"""`ask ... with sampling { ... }`: one ask's sampling fields over the role's, for that
ask's calls (its recovery turns and samples included) and no other, under --max-tokens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import fake_models  # noqa: F401  (the spec's python model)

from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

SPEC = """
model m = python("fake_models:budget_echo") { max_tokens = 60; temperature = 0.5 }
role q { model = m; memory = full; prompt = "go"; reply = sections("#Answer#"); recover = "again"; retries = 1 }
game g {
    a = ask q
    b = ask q with {final: true} with sampling { max_tokens = 10000; stop = "END" }
    c = ask q
    s = sample 2 ask q with sampling { temperature = 0.0 }
}
"""


def budgets(tmp_path: Path, **options) -> list[str]:
    path = tmp_path / "t.ask"
    path.write_text(SPEC)
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True, **options))
    assert rc == 0
    con = open_store(run_dir)
    return [r[0] for r in con.execute("select text from turns where role = 'q' order by turn_index").fetchall()]


def test_an_asks_sampling_applies_to_that_ask_and_its_recovery_only(tmp_path):
    role = "max_tokens=60 temperature=0.5 stop=[]"
    final = "max_tokens=10000 temperature=0.5 stop=['END']"
    greedy = "max_tokens=60 temperature=0.0 stop=[]"
    # each ask is one call and one recovery turn (the fake never writes #Answer#)
    assert budgets(tmp_path) == [role, role, final, final, role, role, greedy, greedy, greedy, greedy]


def test_max_tokens_flag_caps_an_asks_budget(tmp_path):
    texts = budgets(tmp_path, max_tokens=100)
    assert [t.split()[0] for t in texts] == ["max_tokens=60"] * 2 + ["max_tokens=100"] * 2 + ["max_tokens=60"] * 6


def test_max_tokens_flag_caps_a_roles_own_budget(tmp_path):
    path = tmp_path / "r.ask"
    path.write_text("""
model m = python("fake_models:budget_echo") { max_tokens = 60 }
role r { model = m; memory = none; prompt = "go"; max_tokens = 500 }
game g { a = ask r }
""")
    texts = []
    for cap in (None, 100):
        rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / f"runs{cap}"), eval_only=True, max_tokens=cap))
        assert rc == 0
        texts.append(open_store(run_dir).execute("select text from turns").fetchone()[0].split()[0])
    assert texts == ["max_tokens=500", "max_tokens=100"]
