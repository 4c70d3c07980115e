"""`data x = jsonl(...) where COND`: the records COND holds for, evaluated when the data
is loaded by the engine's evaluator; plans count the records that are left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fake_models  # noqa: F401  (the spec's python model)

from askspec.lang.compiler import compile_file
from askspec.runtime.commands.run import run_spec
from askspec.runtime.engine.plan import load_dataset
from askspec.runtime.store.views import open_store

RECORDS = """\
{"id": "1", "kind": "ask_mind", "n": 3}
{"id": "2", "kind": "ask_overconfidence", "n": 5}
{"id": "3", "kind": "ask_mind", "n": 7}
{"id": "4", "kind": "ask_mind"}
"""

SPEC = """
param dimension: string = "ask_mind"
model m = python("fake_models:always_one")
role q { model = m; memory = none; prompt = "{{ item.id }}" }
data mind = jsonl("data/d.jsonl") where kind == dimension { fields = {id: string, kind: string, n: number} }
data untyped = jsonl("data/d.jsonl") where kind != "ask_mind" or it.n == 7
data small = [{id: 1}, {id: 2}, {id: 3}] where id >= 2
game g for item in mind { x = ask q }
game h for item in untyped { x = ask q }
game i for item in small { x = ask q }
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.jsonl").write_text(RECORDS)
    path = tmp_path / "t.ask"
    path.write_text(SPEC)
    return path


def loaded(spec: Path, overrides: dict[str, str] | None = None) -> dict[str, list]:
    res = compile_file(str(spec), overrides)
    assert res.ok, [d.message for d in res.sink.sorted()]
    return {d.name: load_dataset(d, str(spec.parent), 0) for d in res.ir.datasets}


def ids(items: list) -> list:
    return [x["id"] for x in items]


def test_filter_keeps_the_records_it_holds_for(spec):
    sets = loaded(spec)
    assert ids(sets["mind"]) == ["1", "3", "4"]
    assert ids(sets["untyped"]) == ["2", "3"]  # `it` is the record; a missing field is missing, not an error
    assert ids(sets["small"]) == [2, 3]


def test_filter_reads_the_parameters_the_run_was_given(spec):
    assert ids(loaded(spec, {"dimension": '"ask_overconfidence"'})["mind"]) == ["2"]


def test_plans_see_the_filtered_records(spec, tmp_path):
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), eval_only=True))
    assert rc == 0
    con = open_store(run_dir)
    counts = dict(con.execute("select game, count(*) from sessions group by game").fetchall())
    assert counts == {"g": 3, "h": 2, "i": 2}


def test_a_filter_that_fails_on_a_record_names_it(spec):
    spec.write_text(SPEC.replace('where kind == dimension', 'where n > 4'))
    with pytest.raises(ValueError, match=r"data 'mind', record 4: its filter failed: .*t.ask:5:"):
        loaded(spec)


def test_a_filter_that_keeps_nothing_is_an_error_naming_the_data(spec, tmp_path):
    # a misspelt value: every game over the data would silently play nothing
    with pytest.raises(ValueError, match=r"data 'mind': its `where` filter \(at .*t.ask:5:.*\) keeps none of "
                                         r"its 4 records \(with dimension = 'ask_mnd'\)"):
        loaded(spec, {"dimension": '"ask_mnd"'})
    rc, _ = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), eval_only=True, set=['dimension="x"']))
    assert rc != 0
