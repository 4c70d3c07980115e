"""Metrics count the sessions that gave them a value: a `where` that keeps no session
reports "no sessions" with n = 0, never NULL beside a count of sessions it did not use;
`reward(role)` reads the session's reward totals, not a variable."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from askspec.runtime.commands import metrics as metrics_cmd
from askspec.runtime.commands.run import run_spec
from askspec.runtime.engine.metrics import run_metrics

SPEC = """
model m = python("fake_models:always_one")
role a { model = m; memory = none; reply = boxed; prompt = "q" }
game scored for i in [1, 2, 3, 4] {
    r = ask a
    score = i * 10
    reward a = i
}
game plain { r = ask a }
metric mean_big = mean(score where score > 15)
metric mean_huge = mean(score where score > 1000)
metric n_huge = count(score where score > 1000)
metric total_a = mean(reward(a) where score > 25)
metric n_sessions = count(status)
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    path = tmp / "m.ask"
    path.write_text(SPEC)
    rc, run_dir = asyncio.run(run_spec(str(path), eval_only=True, out=str(tmp / "runs")))
    assert rc == 0
    return run_dir


def test_n_counts_the_sessions_a_metric_used(run_dir):
    rows, errors = run_metrics(run_dir)
    got = {r["metric"]: (r["value"], r["n"]) for r in rows}
    assert errors == 0
    assert got["mean_big"] == (pytest.approx(30.0), 3)  # scores 20, 30, 40
    assert got["mean_huge"] == (None, 0)
    assert got["n_huge"] == (None, 0)
    assert got["total_a"] == (pytest.approx(3.5), 2)  # reward totals 3 and 4
    assert got["n_sessions"] == (5, 5)


def test_the_table_says_no_sessions(run_dir, capsys):
    parser = argparse.ArgumentParser(prog="askspec")
    metrics_cmd.register(parser.add_subparsers(dest="command", required=True))
    for fmt in ("table", "json"):
        args = parser.parse_args(["metrics", run_dir, "--format", fmt])
        assert args.func(args) == 0
        out = capsys.readouterr().out
        if fmt == "table":
            line = next(l for l in out.splitlines() if "mean_huge" in l)
            assert "no sessions" in line and line.split()[-1] == "0"
        else:
            row = next(r for r in json.loads(out) if r["metric"] == "mean_huge")
            assert row["value"] is None and row["n"] == 0
