"""PasoDoble draws its knowledge passages at random, seeded (pasodoble.txt Algorithm 1,
"k ~ Sample(K)"), not in file order (issue 15, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

from askspec.lang.compiler import compile_file
from askspec.runtime.engine.plan import load_dataset, plan_sessions

SPECS = Path(__file__).resolve().parents[2] / "specs"


def passage_order(seed: int) -> list[str]:
    res = compile_file(str(SPECS / "pasodoble.ask"))
    assert res.ok
    exp = res.ir
    datasets = {d.name: load_dataset(d, str(SPECS), seed) for d in exp.datasets}
    plans = [p for p in plan_sessions(exp, exp.param_values(), datasets, seed) if p.game == "propose"]
    return [p.bindings["passage"]["id"] for p in plans]


def test_passages_are_drawn_in_a_seeded_random_order():
    file_order = [json.loads(line)["id"] for line in (SPECS / "data" / "passages.jsonl").read_text().splitlines()]
    order = passage_order(0)
    assert sorted(order) == sorted(file_order) and len(order) == 40  # each passage once per pass
    assert order != file_order
    assert passage_order(0) == order  # the same seed, the same draws
    assert passage_order(1) != order  # another run seed, other draws
