"""The engine's bookkeeping of a session (stateful calls, buffer pushes, dropped turns) is
a typed record stored in its own column; resume rebuilds it from there, and from the
dunder keys in `vars` of runs recorded before the column existed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from askspec.lang.compiler import compile_file
from askspec.runtime.commands.run import run_spec
from askspec.runtime.engine.plan import plan_sessions
from askspec.runtime.engine.resume import load_prior
from askspec.runtime.engine.state import DroppedTurns, SessionBook, StatefulCall
from askspec.runtime.store.writer import RunWriter

SPEC = """
buffer kept { capacity = 8; fields = {q: number} }
model m = python("fake_models:always_one")
role a { model = m; memory = none; reply = boxed }
game fill for i in [1, 2, 3] {
    r = ask a using "{{ i }}"
    fresh = novelty(r.text, history = 4)
    push kept: {q: i}
    if i == 2 { drop r }
}
"""


def test_the_book_round_trips_through_json():
    book = SessionBook(stateful=[StatefulCall("novelty", "novelty#1", "t", {"history": 4})],
                       pushes=[("kept", {"q": 1})], dropped=[DroppedTurns("a", [0]), DroppedTurns("b", None)])
    assert SessionBook.from_json(book.to_json()) == book
    assert SessionBook().to_json() is None


def test_legacy_vars_give_up_their_bookkeeping():
    v = {"x": 1, "__pushes__": [["kept", {"q": 1}]], "__dropped__": [{"role": "a", "turns": None}],
         "__stateful__": [["novelty", "novelty#1", "t", {}]]}
    book = SessionBook.from_legacy_vars(v)
    assert v == {"x": 1}
    assert book.pushes == [("kept", {"q": 1})] and book.dropped == [DroppedTurns("a", None)]
    assert book.stateful == [StatefulCall("novelty", "novelty#1", "t", {})]


def _plans(spec: Path):
    exp = compile_file(str(spec)).ir
    return plan_sessions(exp, exp.param_values(), {}, 0)


def test_resume_reads_the_bookkeeping_column(tmp_path):
    spec = tmp_path / "b.ask"
    spec.write_text(SPEC)
    rc, run_dir = asyncio.run(run_spec(str(spec), eval_only=True, out=str(tmp_path / "runs")))
    assert rc == 0
    plans = _plans(spec)
    prior, _ = load_prior(run_dir, {p.session_id for p in plans}, plans)
    assert [prior[p.session_id].book.pushes for p in plans] == [[("kept", {"q": i})] for i in (1, 2, 3)]
    assert prior["s000001"].book.dropped == [DroppedTurns("a", [0])]
    assert [c.fn for c in prior["s000000"].book.stateful] == ["novelty"]
    assert all(not k.startswith("__") for r in prior.values() for k in r.vars)


def test_resume_reads_a_run_recorded_before_the_column(tmp_path):
    spec = tmp_path / "b.ask"
    spec.write_text(SPEC)
    plans = _plans(spec)
    w = RunWriter.create(tmp_path / "runs", experiment="b", experiment_hash="h", ir_json="{}", spec_files={}, seed=0,
                         roles={}, params={}, planned_sessions=1, argv=[])
    a = w.session_started("s000000", game="fill", group_id=None, params={"i": 1}, index=0)
    # the old way: bookkeeping in vars, no bookkeeping field
    w.session_finished("s000000", a, status="ok", outcome=None, error=None,
                       vars={"fresh": 1.0, "__pushes__": [["kept", {"q": 1}]],
                             "__stateful__": [["novelty", "novelty#1", "\\boxed{1}", {"history": 4}]]})
    w.finish()
    prior, _ = load_prior(str(w.run_dir), {"s000000"}, plans)
    res = prior["s000000"]
    assert res.book.pushes == [("kept", {"q": 1})]
    assert res.book.stateful == [StatefulCall("novelty", "novelty#1", "\\boxed{1}", {"history": 4})]
    assert res.vars == {"i": 1, "fresh": 1.0}
