"""Plans are generated lazily and counted arithmetically: `times 10**12`, `sample 10**9`,
`range(0, 10**7)` and `pairs(range(0, 100000))` cost nothing until iterated, `--sessions`
cuts them without building them, the lazy order is the order the evaluator lists, and a
resumed run still finds which planned sessions are done."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_source
from askspec.runtime.engine.evaluator import Env, evaluate
from askspec.runtime.engine.plan import plan_sessions

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]  # tests/: fake_models and slow_model, the specs' python models

HEADER = 'model m = python("fake_models:universal")\nrole a { model = m; memory = none; prompt = "hi" }\n'


def _compile(tmp_path: Path, games: str):
    path = tmp_path / "p.ask"
    text = HEADER + games
    path.write_text(text)
    res = compile_source(str(path), text)
    assert res.ok, [d.message for d in res.sink.items]
    return res.ir


@pytest.mark.parametrize("game, total", [
    ("game g times 1000000000000 { ask a }", 10**12),
    ("game g for i in range(0, 10000000) { ask a }", 10**7),  # range is half-open
    ("game g for (x, y) in pairs(range(0, 100000)) { ask a }", 100000 * 99999 // 2),
    ("game g for (x, y) in product([1, 2, 3], range(1, 1000000)) times 2 { ask a }", 3 * 999999 * 2),
])
def test_huge_plans_are_counted_and_cut_without_being_built(tmp_path, game, total):
    exp = _compile(tmp_path, game)
    params = exp.param_values()
    assert plan_sessions(exp, params, {}, 0).total == total
    cut = plan_sessions(exp, params, {}, 0, max_sessions=5)
    assert cut.total == 5 and [p.session_id for p in cut] == [f"s{k:06d}" for k in range(5)]


def test_the_lazy_order_is_the_evaluators(tmp_path):
    """Session bindings (and so ids and seeds) are what the eager plan gave."""
    exp = _compile(tmp_path, "game g for (x, y) in pairs(range(1, 6)) times 2 { ask a }\n"
                             "game h for (x, y) in product([1, 2], range(0, 2)) { ask a }\n")
    plans = list(plan_sessions(exp, exp.param_values(), {}, 7))
    env = Env(vars={}, params={})
    expected = []
    for g in exp.games:
        for item in evaluate(g.iter, env):
            expected += [dict(zip(g.pattern, item))] * g.times
    assert [p.bindings for p in plans] == expected
    assert len({p.seed for p in plans}) == len(plans)


def test_a_cut_keeps_whole_groups(tmp_path):
    exp = _compile(tmp_path, "game g for i in range(1, 1000000) sample 4 { ask a\n route a { else -> keep } }")
    plan = plan_sessions(exp, exp.param_values(), {}, 0, max_sessions=6)
    assert plan.total == 8 and len(list(plan)) == 8
    assert {p.group_id for p in plan} == {"g-g00000-r000", "g-g00001-r000"}


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ASKSPEC_DEBUG"}
    env["PYTHONPATH"] = str(TESTS) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "askspec.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_run_cuts_a_huge_plan_and_refuses_it_whole(tmp_path):
    spec = tmp_path / "huge.ask"
    spec.write_text(HEADER + "game g for (x, y) in pairs(range(0, 100000)) times 1000 { ask a }\n")
    out = tmp_path / "runs"
    ok = _run("run", str(spec), "--sessions", "3", "--out", str(out), "--quiet")
    assert ok.returncode == 0, ok.stderr
    assert "3 sessions of huge" in ok.stderr
    whole = _run("run", str(spec), "--out", str(tmp_path / "other"))
    assert whole.returncode == 1
    assert "plans 4,999,950,000,000 sessions, more than the limit of 1,000,000" in whole.stderr
    assert "--sessions N" in whole.stderr and not (tmp_path / "other").exists()


def test_run_refuses_a_group_larger_than_the_limit(tmp_path):
    spec = tmp_path / "group.ask"
    spec.write_text(HEADER + "game g sample 1000000000 {\n    ask a\n    route a { else -> keep }\n}\n")
    res = _run("run", str(spec), "--sessions", "2", "--out", str(tmp_path / "runs"))
    assert res.returncode == 1 and "groups of 1,000,000,000 sessions" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_resume_finds_the_done_sessions_of_a_lazy_plan(tmp_path):
    """A cut plan of a huge game, interrupted and resumed: the done sessions are found
    by walking the (lazy) plan, and only the others run."""
    from askspec.runtime.commands.run import run_spec
    from askspec.runtime.store.views import open_store

    spec = tmp_path / "slow.ask"
    spec.write_text('model m = python("slow_model:reply")\nrole a { model = m; memory = none; prompt = "q {{ i }}" }\n'
                    "game g for i in range(1, 10000000) {\n    x = ask a\n}\n")
    out = tmp_path / "runs"

    async def go():
        task = asyncio.ensure_future(run_spec(str(spec), out=str(out), sessions=6, concurrency=1))
        while True:
            await asyncio.sleep(0.05)
            dirs = [d for d in out.glob("*") if not d.name.startswith(".")] if out.exists() else []
            if dirs and (dirs[0] / "events" / "sessions.ndjson").read_text().count('"finished"') >= 2:
                break
        task.cancel()
        rc, run_dir = await task
        assert rc == 130
        return run_dir, await run_spec(resume=run_dir)

    run_dir, (rc, _) = asyncio.run(go())
    assert rc == 0
    con = open_store(run_dir)
    rows = con.execute("select session_id, attempt from sessions where status = 'ok' order by session_id").fetchall()
    assert [r[0] for r in rows] == [f"s{k:06d}" for k in range(6)]
    assert sum(1 for r in rows if r[1] == 1) >= 2  # the finished ones were not run again
    assert con.execute("select count(*) from turns").fetchone()[0] == 6


def test_itertools_pairs_match_the_evaluator():
    """The planner's lazy pairs are itertools.combinations; the evaluator lists the same."""
    from askspec.ir.builtins import pairs

    xs = list(range(7))
    assert pairs(xs) == [list(p) for p in itertools.combinations(xs, 2)]
