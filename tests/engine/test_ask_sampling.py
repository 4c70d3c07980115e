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


def test_max_tokens_flag_never_raises_a_budget(tmp_path):
    """--max-tokens caps: a model and role that set no budget keep the compiled default
    (vocab.SAMPLING_DEFAULTS' 256) under a larger cap, and get the cap under a smaller one
    (it once set the model's budget to the cap when the model had none)."""
    path = tmp_path / "d.ask"
    path.write_text("""
model m = python("fake_models:budget_echo")
role r { model = m; memory = none; prompt = "go" }
game g { a = ask r }
""")
    texts = []
    for cap in (None, 1000, 100):
        rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / f"runs{cap}"), eval_only=True, max_tokens=cap))
        assert rc == 0
        texts.append(open_store(run_dir).execute("select text from turns").fetchone()[0].split()[0])
    assert texts == ["max_tokens=256", "max_tokens=256", "max_tokens=100"]


def test_a_role_section_applies_to_that_role_of_the_ask_only(tmp_path):
    path = tmp_path / "two.ask"
    path.write_text("""
model m = python("fake_models:budget_echo") { max_tokens = 60; temperature = 0.5 }
role a, b { model = m; memory = none; prompt = "go" }
game g {
    x, y = ask a, b with sampling { max_tokens = 100; b { max_tokens = 8192; stop = "END" } }
    z = ask b
}
""")
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True))
    assert rc == 0
    rows = open_store(run_dir).execute("select role, text from turns order by role, turn_index").fetchall()
    assert rows == [("a", "max_tokens=100 temperature=0.5 stop=[]"),
                    ("b", "max_tokens=8192 temperature=0.5 stop=['END']"),
                    ("b", "max_tokens=60 temperature=0.5 stop=[]")]


def test_a_role_section_applies_to_a_one_role_ask(tmp_path):
    """The plain one-role ask (the engine's fast path) takes its role section too."""
    path = tmp_path / "one.ask"
    path.write_text("""
model m = python("fake_models:budget_echo") { max_tokens = 60; temperature = 0.5 }
role a { model = m; memory = none; prompt = "go" }
game g {
    x = ask a with sampling { a { max_tokens = 8 } }
    y = ask a
}
""")
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True))
    assert rc == 0
    rows = [r[0] for r in open_store(run_dir).execute("select text from turns order by turn_index").fetchall()]
    assert rows == ["max_tokens=8 temperature=0.5 stop=[]", "max_tokens=60 temperature=0.5 stop=[]"]


def test_model_flag_swaps_weights_under_the_specs_sampling(tmp_path):
    """`--model ROLE=backend:weights` (the paper's model in place of the shipped one) keeps
    the sampling of the model the spec gives the role."""
    path = tmp_path / "w.ask"
    path.write_text("""
model m = python("fake_models:budget_echo") { max_tokens = 60; temperature = 0.5 }
role a { model = m; memory = none; prompt = "go" }
game g { x = ask a }
""")
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True,
                                       model=["a=python:fake_models:budget_echo"]))
    assert rc == 0
    assert open_store(run_dir).execute("select text from turns").fetchone()[0] == "max_tokens=60 temperature=0.5 stop=[]"


def test_model_flag_reaches_the_roles_current_models(tmp_path):
    """`current(a)` serves a's weights: after `--model a=...` the swapped-in ones, under the
    current model's own sampling (Ask-E's answer key and downstream solver)."""
    path = tmp_path / "c.ask"
    path.write_text("""
model m = hf("smollm2-135m-instruct") { max_tokens = 60; temperature = 0.5 }  # never loaded: --model replaces it
model greedy = current(a) { temperature = 0.0 }
role a { model = m; trained; memory = none; prompt = "go" }
role k { model = greedy; memory = none; prompt = "go" }
game g { x = ask a; y = ask k; reward a = 1 }
train a with grpo { steps = 1; batch = 1 }
""")
    rc, run_dir = asyncio.run(run_spec(str(path), out=str(tmp_path / "runs"), eval_only=True,
                                       model=["a=python:fake_models:seeded"]))
    assert rc == 0
    rows = open_store(run_dir).execute("select role, text from turns order by role").fetchall()
    assert rows[0][0] == "a" and rows[0][1].startswith("#Answer# seed=")
    assert rows[1][0] == "k" and rows[1][1].startswith("#Answer# seed=")  # the swapped-in weights answer
