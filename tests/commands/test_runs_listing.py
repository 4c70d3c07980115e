"""Runs you can tell apart: `askspec runs` and the `runs` view show the backend (and
endpoint) of each role, the seed, profile, --eval-only, the --set overrides, --concurrency,
--max-tokens, how long the run ran and its token totals; `askspec runs DIR` finds runs in
subfolders."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from askspec.runtime.commands.run import run_spec
from askspec.runtime.store import layout
from askspec.runtime.store.views import open_store

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]  # tests/: fake_models and slow_model, the specs' python models

SPEC = """
experiment tell_apart { param k: int = 2; profile = wide }
profile wide { param k = 2 }
profile narrow { param k = 1 }
model tools = python("fake_models:universal")
role solver { model = tools; memory = none; prompt = "solve {{ i }}" }
role checker { memory = none; prompt = "check {{ i }}" }
game g for i in range(0, k) {
    x = ask solver
    bind checker = "python:fake_models:seeded"
    y = ask checker
}
"""


def _runs_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ASKSPEC_DEBUG"}
    return subprocess.run([sys.executable, "-m", "askspec.cli", "runs", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_runs_tells_runs_apart_and_finds_subfolders(tmp_path):
    spec = tmp_path / "tell_apart.ask"
    spec.write_text(SPEC)
    root = tmp_path / "experiments"
    rc1, run1 = asyncio.run(run_spec(str(spec), out=str(root / "ablation" / "a"), set=["k=3"], concurrency=2,
                                     max_tokens=50))
    rc2, run2 = asyncio.run(run_spec(str(spec), out=str(root / "ablation" / "b" / "deeper"), sessions=1, seed=7,
                                     profile="narrow", eval_only=True))
    assert rc1 == rc2 == 0

    res = _runs_cli(str(root), "--format", "json")
    assert res.returncode == 0, res.stderr
    rows = {r["run_dir"]: r for r in json.loads(res.stdout)}
    assert set(rows) == {str(Path(run1).resolve()), str(Path(run2).resolve())}
    first, second = rows[str(Path(run1).resolve())], rows[str(Path(run2).resolve())]
    # the spec's default profile is recorded too: the IR a run played is that profile's
    assert first["settings"] == "--seed 0 --profile wide --max-tokens 50 --concurrency 2 --set k=3"
    assert second["settings"] == "--seed 7 --profile narrow --sessions 1 --concurrency 8 --eval-only"
    # the model each role ran on, including one bound during the session
    assert first["models"] == "python:fake_models:universal (solver); python:fake_models:seeded (checker)"
    assert (first["ok"], first["turns"], first["planned_sessions"]) == (3, 6, 3)
    assert isinstance(first["duration_s"], float) and first["duration_s"] >= 0
    assert first["tokens_out"] == first["totals"]["tokens_out"]

    table = _runs_cli(str(root))
    assert table.returncode == 0
    header = table.stdout.splitlines()[0].split()
    assert header == ["run_id", "experiment", "status", "started", "duration", "ok", "error", "running", "planned",
                      "tokens_in", "tokens_out", "models", "settings", "hash"]
    assert "--set k=3" in table.stdout and "(2 rows)" in table.stdout

    # the same facts are columns of the `runs` view
    con = open_store(run1)
    overrides, options, totals, duration = con.execute(
        "select overrides, run_options, totals, duration_s from runs").fetchone()
    assert json.loads(overrides) == {"k": 3}
    assert json.loads(options)["concurrency"] == 2 and json.loads(options)["max_tokens"] == 50
    assert json.loads(totals)["turns"] == 6 and duration is not None
    roles = json.loads(con.execute("select roles from runs").fetchone()[0])
    assert roles["checker"]["models"] == [{"name": "python:fake_models:seeded", "backend": "python",
                                           "model": "fake_models:seeded", "endpoint": None}]


def test_find_run_dirs_looks_into_subfolders_but_not_into_runs(tmp_path):
    for rel in ("x/20260101-000000-a-000001", "x/y/z/20260101-000000-b-000002", ".hidden/20260101-000000-c-000003"):
        d = tmp_path / rel
        (d / "spec").mkdir(parents=True)
        (d / "manifest.json").write_text("{}")
    # a run dir's own folders are not searched
    (tmp_path / "x/20260101-000000-a-000001/spec/20260101-000000-d-000004").mkdir()
    (tmp_path / "x/20260101-000000-a-000001/spec/20260101-000000-d-000004/manifest.json").write_text("{}")
    found = [p.name for p in layout.find_run_dirs(tmp_path)]
    assert found == ["20260101-000000-a-000001", "20260101-000000-b-000002"]
