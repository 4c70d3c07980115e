"""`askspec run --base-url URL [--served-model ...]` against a real OpenAI-compatible HTTP
server on loopback: the endpoint and the served model are recorded per role in the
manifest and in `turns.model`, `askspec runs` shows them, and `--resume` goes back to the
recorded server whatever $OPENAI_BASE_URL says now (and refuses another --base-url)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from fake_openai_server import FakeOpenAIServer  # (tests/, on sys.path: tests/conftest.py)

from askspec.runtime.commands.run import run_spec
from askspec.runtime.commands.runs import list_runs
from askspec.runtime.store import layout
from askspec.runtime.store.views import open_store

# The quickstart's shape: a model declared for the embedded backend, sent to a server.
SPEC = """
experiment local { param n: int = 3 }
model policy = hf("smollm2-135m-instruct") { temperature = 0.5; retries = 0 }
role asker { model = policy; memory = none; prompt = "question {{ i }}" }
role checker { model = policy; memory = none; prompt = "check {{ i }}" }
game g for i in range(0, n) {
    x = ask asker
    y = ask checker
}
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "local.ask"
    path.write_text(SPEC)
    return path


def _manifest(run_dir: str) -> dict:
    return layout.read_manifest(run_dir)


def test_base_url_uses_the_one_served_model_and_records_the_endpoint(spec, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    async def go():
        async with FakeOpenAIServer(served=["Qwen/Qwen3-0.6B"]) as server:
            rc, run_dir = await run_spec(str(spec), out=str(tmp_path / "runs"), backend="openai",
                                         base_url=server.base_url + "/")
            return rc, run_dir, server

    rc, run_dir, server = asyncio.run(go())
    assert rc == 0
    # not the embedded weights' name: the model the server lists
    assert {b["model"] for b in server.bodies} == {"Qwen/Qwen3-0.6B"} and len(server.bodies) == 6
    con = open_store(run_dir)
    assert {r[0] for r in con.execute("select distinct model from turns").fetchall()} == {
        f"Qwen/Qwen3-0.6B@{server.base_url}"}
    roles = _manifest(run_dir)["roles"]
    for role in ("asker", "checker"):
        assert roles[role]["models"] == [{"name": "policy", "backend": "openai", "model": "Qwen/Qwen3-0.6B",
                                          "endpoint": server.base_url}]
    assert _manifest(run_dir)["run_options"]["base_url"] == server.base_url  # trailing slash dropped
    (run,) = list_runs(tmp_path / "runs")
    assert run["models"] == f"openai:Qwen/Qwen3-0.6B@{server.base_url} (asker, checker)"
    assert f"--backend openai" in run["settings"] and f"--base-url {server.base_url}" in run["settings"]
    assert run["tokens_out"] == 12 and run["turns"] == 6


def test_served_model_per_role_and_for_every_model(spec, tmp_path):
    async def go():
        async with FakeOpenAIServer(served=["a-model", "b-model"]) as server:
            rc, run_dir = await run_spec(str(spec), out=str(tmp_path / "runs"), backend="openai",
                                         base_url=server.base_url, served_model=["b-model", "asker=a-model"])
            return rc, run_dir, server

    rc, run_dir, server = asyncio.run(go())
    assert rc == 0
    con = open_store(run_dir)
    rows = dict(con.execute("select distinct role, model from turns").fetchall())
    assert rows == {"asker": f"a-model@{server.base_url}", "checker": f"b-model@{server.base_url}"}
    asked = {(b["messages"][-1]["content"].split()[0], b["model"]) for b in server.bodies}
    assert asked == {("question", "a-model"), ("check", "b-model")}


def test_a_server_without_the_model_is_refused_before_the_run(spec, tmp_path, capsys):
    async def go():
        async with FakeOpenAIServer(served=["a-model", "b-model"]) as server:
            return await run_spec(str(spec), out=str(tmp_path / "runs"), backend="openai", base_url=server.base_url)

    rc, run_dir = asyncio.run(go())
    err = capsys.readouterr().err
    assert rc == 1 and run_dir is None and not (tmp_path / "runs").exists()
    assert "serves 'a-model', 'b-model', not 'smollm2-135m-instruct'" in err and "--served-model asker=NAME" in err


async def _interrupted_run(spec: Path, out: Path, **options) -> str:
    """Start a run on a slow server, cancel it (as Ctrl-C does) once a session finished."""
    task = asyncio.ensure_future(run_spec(str(spec), out=str(out), concurrency=1, **options))
    while True:
        await asyncio.sleep(0.02)
        dirs = [d for d in out.glob("*") if d.is_dir() and not d.name.startswith(".")] if out.exists() else []
        if dirs and '"finished"' in (dirs[0] / "events" / "sessions.ndjson").read_text():
            break
    task.cancel()
    rc, run_dir = await task
    assert rc == 130 and _manifest(run_dir)["status"] == "interrupted"
    return run_dir


def test_resume_goes_back_to_the_recorded_server(spec, tmp_path, monkeypatch, capsys):
    """The first run found its server through $OPENAI_BASE_URL; the resume runs with the
    variable pointing elsewhere and no flag, and still asks the recorded server."""

    async def go():
        async with FakeOpenAIServer(served=["m"], delay=0.2) as server, FakeOpenAIServer(served=["m"]) as other:
            monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
            run_dir = await _interrupted_run(spec, tmp_path / "runs", backend="openai")
            before = len(server.bodies)
            monkeypatch.setenv("OPENAI_BASE_URL", other.base_url)
            rc, _ = await run_spec(resume=run_dir)
            return rc, run_dir, server, other, before

    rc, run_dir, server, other, before = asyncio.run(go())
    assert rc == 0
    assert len(server.bodies) > before and other.bodies == []
    assert f"resuming against {server.base_url}" in capsys.readouterr().err
    con = open_store(run_dir)
    assert [r[0] for r in con.execute("select status from sessions").fetchall()] == ["ok"] * 3
    assert {r[0] for r in con.execute("select distinct model from turns").fetchall()} == {f"m@{server.base_url}"}


def test_resume_refuses_another_base_url(spec, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    async def go():
        async with FakeOpenAIServer(served=["m"], delay=0.2) as server, FakeOpenAIServer(served=["m"]) as other:
            run_dir = await _interrupted_run(spec, tmp_path / "runs", backend="openai", base_url=server.base_url)
            rc, _ = await run_spec(resume=run_dir, base_url=other.base_url)
            same, _ = await run_spec(resume=run_dir, base_url=server.base_url)  # the same one is fine
            return rc, same, server, other, run_dir

    rc, same, server, other, run_dir = asyncio.run(go())
    err = capsys.readouterr().err
    assert rc == 1 and f"refusing to resume {run_dir}: it ran --base-url {server.base_url}" in err
    assert same == 0 and other.bodies == []
    assert _manifest(run_dir)["status"] == "finished"


def test_base_url_is_checked(spec, tmp_path, capsys):
    for options, message in [
        ({"base_url": "localhost:8000"}, "--base-url wants an http:// or https:// URL"),
        ({"base_url": "http://x/v1", "backend": "hf"}, "does not apply to --backend hf"),
        ({"served_model": "checkr=m", "backend": "openai"}, "no role or model named 'checkr' (did you mean 'checker'?)"),
        ({"endpoint": "checkr=http://h:8002/v1"}, "--endpoint checkr=...: no role or model named 'checkr' "
                                                  "(did you mean 'checker'?)"),
    ]:
        rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), **options))
        err = capsys.readouterr().err
        assert rc == 1 and run_dir is None and message in err, (options, err)
    assert not (tmp_path / "runs").exists()


# Ask-E's shape: one model with weights, one python callable (the SymPy boundary).
MIXED = """
experiment mixed { param n: int = 2 }
model policy = hf("smollm2-135m-instruct") { temperature = 0.5; retries = 0 }
model solver = python("askspec.runtime.backends.solvers:sympy_math")
role asker { model = policy; memory = none; prompt = "question {{ i }}" }
role calc { model = solver; memory = none; prompt = "What is 6 * 7?" }
game g for i in range(0, n) {
    x = ask asker
    y = ask calc
}
"""


def test_backend_openai_moves_the_models_with_weights_and_leaves_python_ones(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    path = tmp_path / "mixed.ask"
    path.write_text(MIXED)

    async def go():
        async with FakeOpenAIServer(served=["Qwen/Qwen3-0.6B"]) as server:
            rc, run_dir = await run_spec(str(path), out=str(tmp_path / "runs"), backend="openai",
                                         base_url=server.base_url)
            return rc, run_dir, server

    rc, run_dir, server = asyncio.run(go())
    assert rc == 0
    assert len(server.bodies) == 2  # the asker's two calls; the solver never reached the server
    con = open_store(run_dir)
    by_role = dict(con.execute("select role, any_value(model) from turns group by role").fetchall())
    assert by_role == {"asker": f"Qwen/Qwen3-0.6B@{server.base_url}", "calc": "solver"}
    texts = {r[0] for r in con.execute("select text from turns where role = 'calc'").fetchall()}
    assert len(texts) == 1 and texts.pop().endswith("\\boxed{42}")  # SymPy's answer, not the server's
    roles = _manifest(run_dir)["roles"]
    assert roles["calc"]["models"] == [{"name": "solver", "backend": "python",
                                        "model": "askspec.runtime.backends.solvers:sympy_math", "endpoint": None}]
