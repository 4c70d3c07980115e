"""What a seed reproduces across `--concurrency` (issue #14, item 3; README,
"Reproducibility"): replay and request-pure python backends give the same sessions at
concurrency 1 and 8; on hf, the same seed at concurrency 1 gives the same sessions
(batched runs are not promised to); the manifest records which promise a run has."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

GAME = """
experiment dialog {{ param n: int = 12 }}
model m = {model}
role asker {{ model = m; memory = full; prompt = "Ask about {{{{ i }}}}." }}
role answerer {{ model = m; memory = full; prompt = "Answer: {{{{ q.text }}}}" }}
game talk for i in range(0, n) {{
    repeat t in 1..3 {{
        q = ask asker
        a = ask answerer
    }}
}}
"""

SEEDED = '''
import random

def reply(messages, request):
    """A request-pure model: its reply depends on the request alone (seed, history)."""
    rng = random.Random(request.sampling.seed)
    return f"{request.role} says {rng.randint(0, 10**9)} after {len(messages)} messages"
'''


def _turns(run_dir: str) -> list[tuple]:
    con = open_store(run_dir)
    return con.execute("select session_id, turn_index, role, text, prompt from turns "
                       "order by session_id, turn_index").fetchall()


def _run(spec: Path, out: Path, concurrency: int, **kw) -> tuple[list[tuple], dict]:
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(out), concurrency=concurrency, seed=7, **kw))
    assert rc == 0
    manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    return _turns(run_dir), manifest["determinism"]


def test_python_backend_gives_the_same_sessions_at_any_concurrency(tmp_path, monkeypatch):
    (tmp_path / "askspec_seeded_model.py").write_text(SEEDED)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = tmp_path / "dialog.ask"
    spec.write_text(GAME.format(model='python("askspec_seeded_model:reply")'))
    one, rec1 = _run(spec, tmp_path / "c1", 1)
    eight, rec8 = _run(spec, tmp_path / "c8", 8)
    assert len(one) == 12 * 6
    assert one == eight
    assert rec1["concurrency"] == 1 and rec8["concurrency"] == 8 and rec8["seed"] == 7
    assert rec8["roles"]["asker"]["m"]["level"] == "callable"


def test_replay_gives_the_same_sessions_at_any_concurrency(tmp_path):
    spec = tmp_path / "dialog.ask"
    spec.write_text(GAME.format(model='replay("rec.json")'))
    (tmp_path / "rec.json").write_text(json.dumps({"sessions": [
        {"asker": [f"q{k}.{t}" for t in range(3)], "answerer": [f"a{k}.{t}" for t in range(3)]} for k in range(12)]}))
    one, _ = _run(spec, tmp_path / "c1", 1)
    eight, rec = _run(spec, tmp_path / "c8", 8)
    assert one == eight
    assert rec["roles"]["answerer"]["m"]["level"] == "exact"


@pytest.mark.slow
def test_hf_same_seed_same_concurrency_one_gives_the_same_sessions(tmp_path):
    """The real SmolLM2, sampling (temperature 1) with per-call seeds: twice at
    --concurrency 1, the same text; the manifest says why, and what a batched run lacks."""
    spec = tmp_path / "dialog.ask"
    spec.write_text(GAME.format(model='hf("smollm2-135m-instruct")'))
    kw = dict(set=["n=1"], max_tokens=8)
    first, rec = _run(spec, tmp_path / "a", 1, **kw)
    again, _ = _run(spec, tmp_path / "b", 1, **kw)
    assert len(first) == 6 and all(t[3] for t in first)
    assert first == again
    assert rec["roles"]["asker"]["m"]["level"] == "seed" and rec["roles"]["asker"]["m"]["max_batch"] == 8
    _, batched = _run(spec, tmp_path / "c", 8, set=["n=1"], max_tokens=2)
    assert batched["roles"]["asker"]["m"]["level"] == "batch"
    assert "--concurrency 1" in batched["roles"]["asker"]["m"]["why"]


def test_the_record_includes_a_model_as_soon_as_it_is_bound(tmp_path, monkeypatch):
    """The manifest is rewritten when a role gets a model during the run (on_bind); the
    record made then already lists that model."""
    from askspec.lang.compiler import compile_source
    from askspec.runtime.commands.options import RunOptions
    from askspec.runtime.commands.resolver import ModelResolver
    from askspec.runtime.commands.start import determinism_record

    (tmp_path / "askspec_seeded_model.py").write_text(SEEDED)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = GAME.format(model='python("askspec_seeded_model:reply")')
    res = compile_source(str(tmp_path / "d.ask"), text, {})
    opts = RunOptions(file=str(tmp_path / "d.ask"), concurrency=4)
    resolver = ModelResolver(res.ir, opts, str(tmp_path))
    records: list[dict] = []
    resolver.on_bind = lambda role, info: records.append(determinism_record(opts, 3, resolver))
    resolver.resolve("answerer", "m")
    assert records[-1] == {"seed": 3, "concurrency": 4, "roles": {"answerer": {"m": {
        "backend": "python", **resolver.resolve("answerer", "m").backend.determinism(4)}}}}
    assert len(records) == 1  # told once per new (role, model)
