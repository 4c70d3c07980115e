"""A spec runs on the openai backend against a real OpenAI-compatible HTTP server on
loopback: transient 500s and 429s are absorbed by the retries; an endpoint that keeps
failing marks only its session as an error and the run goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fake_openai_server import FakeOpenAIServer  # (tests/, on sys.path: tests/conftest.py)

from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

SPEC = """
experiment remote {{ param n: int = 3 }}
model served = openai("served-model") {{ base_url = "{url}"; retries = {retries}; top_k = 20; temperature = 0.5 }}
role a {{ model = served; memory = full; prompt = "question {{{{ i }}}}" }}
game g for i in range(1, n + 1) {{
    x = ask a
    y = ask a
}}
"""


def _run(tmp_path: Path, script: list[str], retries: int):
    async def go():
        async with FakeOpenAIServer(script) as server:
            spec = tmp_path / "remote.ask"
            spec.write_text(SPEC.format(url=server.base_url, retries=retries))
            rc, run_dir = await run_spec(str(spec), out=str(tmp_path / "runs"), concurrency=1, eval_only=True)
            return rc, run_dir, server

    return asyncio.run(go())


def test_transient_errors_are_absorbed(tmp_path):
    rc, run_dir, server = _run(tmp_path, ["500", "ok", "429", "ok", "500"], retries=3)
    assert rc == 0
    con = open_store(run_dir)
    assert [r[0] for r in con.execute("select status from sessions").fetchall()] == ["ok"] * 3
    texts = [r[0] for r in con.execute("select text from turns order by session_id, turn_index").fetchall()]
    assert texts[0] == "echo: question 1" and len(texts) == 6
    # non-OpenAI sampling fields travel in extra_body; the conversation is kept (memory full)
    ok_bodies = [b for b in server.bodies if b.get("top_k") == 20]
    assert ok_bodies and all(b["temperature"] == 0.5 for b in ok_bodies)
    assert max(len(b["messages"]) for b in server.bodies) == 3


def test_failing_endpoint_marks_session_error(tmp_path):
    rc, run_dir, _ = _run(tmp_path, ["500", "500", "500"], retries=2)
    assert rc == 0
    con = open_store(run_dir)
    rows = con.execute("select session_id, status, error from sessions order by session_id").fetchall()
    assert rows[0][1] == "error" and ("500" in rows[0][2] or "upstream" in rows[0][2])
    assert [r[1] for r in rows[1:]] == ["ok", "ok"]
