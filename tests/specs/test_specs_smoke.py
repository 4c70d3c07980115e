"""Every spec in specs/ runs end to end (a couple of sessions) on a Python-backed fake
model whose reply satisfies every parser, so each game's whole protocol executes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from askspec.ir import model as ir
from askspec.lang.compiler import compile_file
from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

SPECS = sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.ask"))


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_spec_runs_on_fake_model(spec, tmp_path):
    res = compile_file(str(spec))
    assert res.ok
    roles = [r.name for r in res.ir.roles]
    models = [f"{r}=python:fake_models:universal" for r in roles]
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path), model=models, sessions=2, concurrency=4, eval_only=True))
    assert rc == 0
    con = open_store(run_dir)
    rows = con.execute("select session_id, status, error from sessions").fetchall()
    assert rows, "no sessions recorded"
    errors = [r for r in rows if r[1] != "ok"]
    assert not errors, errors[:3]
    assert con.execute("select count(*) from turns").fetchone()[0] > 0
