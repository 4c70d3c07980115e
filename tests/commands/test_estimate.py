"""`askspec estimate`: on three specs (a remembering dialogue that may stop early, a
`sample N` game routed to a tournament, a capped-prompt pair of roles), the estimate from a
short recorded run (`--from`) is within 20 % of the tokens a full run with another seed
spends, per role; the plan's bounds hold for every run; the command prints estimate vs
spent, the GPU-hours line and `check`'s one-line summary.

The models are Python callables that count tokens as words and reply at seeded random
lengths, so the runs differ in what they spend and the test measures a real estimate."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_file
from askspec.runtime.commands.estimate import (Cell, estimate, parse_gpu, read_rates, session_bounds,
                                                stage_sessions)
from askspec.runtime.commands.run import run_spec

ROOT = Path(__file__).resolve().parents[2]

MODELS = '''
import random
from askspec.runtime.backends.base import ChatResult

def _words(messages):
    return sum(len(str(m["content"]).split()) for m in messages)

def wordy(messages, request):
    """A reply of 20-60 words (stops early or not at random); tokens are words."""
    rng = random.Random(request.sampling.seed)
    n = rng.randint(20, 60)
    verdict = "yes" if rng.random() < 0.5 else "no"
    text = f"#Answer# \\\\boxed{{{verdict}}} " + " ".join("w" for _ in range(n))
    return ChatResult(text=text, finish_reason="stop", tokens_in=_words(messages),
                      tokens_out=min(len(text.split()), request.sampling.max_tokens))

def judge(messages, request):
    rng = random.Random(request.sampling.seed)
    text = "Response " + rng.choice("AB") + " wins. \\\\boxed{" + rng.choice("AB") + "} " + "w " * rng.randint(5, 30)
    return ChatResult(text=text, finish_reason="stop", tokens_in=_words(messages), tokens_out=len(text.split()))
'''

DIALOGUE = """
experiment dialogue { param n: int = 160 }
model m = python("estimate_models:wordy") { max_tokens = 80 }
role asker { model = m; memory = full; prompt = "ask about {{ i }}" }
role solver { model = m; memory = full; prompt = "answer the question about {{ i }}" ; reply = boxed }
game talk for i in range(0, n) {
    repeat 4 {
        q = ask asker
        a = ask solver
        if a.answer == "yes" { end }
    }
    reward solver as done = 1.0
}
"""

ARENA = """
experiment arena { param n: int = 40 }
model m = python("estimate_models:wordy") { max_tokens = 70 }
model j = python("estimate_models:judge") { max_tokens = 40 }
role policy { model = m; memory = none; prompt = "solve {{ i }}"; reply = boxed }
role judge { model = j; memory = none }
tournament arena {
    judge = judge
    prompt = "A: {{ response_a }} B: {{ response_b }}"
    pairing = round_robin
    verdict = boxed("A", "B", "Tie")
    aggregate = win_rate
}
game solve for i in range(0, n) sample 4 {
    t = ask policy
    reward policy as v = case { t.answer == "yes" -> 1.0; else -> 0.0 }
    route policy { else -> tournament arena }
}
"""

PAIR = """
experiment pair { param n: int = 160 }
model m = python("estimate_models:wordy") { max_tokens = 60 }
role writer { model = m; memory = none; max_prompt_tokens = 400; prompt_overflow = truncate_left; prompt = "write {{ i }}" }
role critic { model = m; memory = none; max_prompt_tokens = 400; prompt_overflow = truncate_left; prompt = "judge {{ w.text }}" }
game review for i in range(0, n) {
    w = ask writer
    c = ask critic with { w: w }
    if c.answer == "no" { w2 = ask writer }
    reward writer as ok = 1.0
}
"""

SPECS = {"dialogue": DIALOGUE, "arena": ARENA, "pair": PAIR}


@pytest.fixture
def spec_dir(tmp_path, monkeypatch):
    (tmp_path / "estimate_models.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, text in SPECS.items():
        (tmp_path / f"{name}.ask").write_text(textwrap.dedent(text))
    return tmp_path


def _run(spec: Path, out: Path, **kw) -> str:
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(out), quiet=True, **kw))
    assert rc == 0 and run_dir
    return run_dir


def _spent(run_dir: str) -> dict[str, Cell]:
    rates = read_rates(run_dir)
    out: dict[str, Cell] = {}
    for (_, role), c in rates.spent.items():
        out.setdefault(role, Cell()).add(c)
    return out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_estimate_from_a_short_run_is_within_20_percent_and_bounds_hold(spec_dir, name):
    spec = spec_dir / f"{name}.ask"
    exp = compile_file(str(spec)).ir
    assert exp is not None
    # an earlier run of half the plan (whole groups) and a full run with another seed
    half = sum(n or 0 for _, plan in stage_sessions(exp) for n in plan.values()) // 2
    pilot = _run(spec, spec_dir / "pilot", sessions=half, seed=1)
    full = _run(spec, spec_dir / "full", seed=2)
    est = estimate(exp, read_rates(pilot))
    spent = _spent(full)
    assert set(spent) == set(est.by_role())
    for role, (bound, expected) in est.by_role().items():
        actual = spent[role]
        assert expected is not None and expected.tokens
        assert abs(expected.tokens - actual.tokens) <= 0.20 * actual.tokens, (role, expected, actual)
        # the bounds hold, for the full run and for the pilot
        assert actual.calls <= bound.calls and actual.completion <= bound.completion
        if bound.prompt is not None:
            assert actual.prompt <= bound.prompt
    # the game's sessions are the plan's
    assert [sum(n for n in plan.values() if n) for _, plan in stage_sessions(exp)] == [
        sum(read_rates(full).sessions.values())]


def test_bounds_are_the_plan_times_max_tokens(spec_dir):
    exp = compile_file(str(spec_dir / "arena.ask")).ir
    per = session_bounds(exp, exp.games[0])
    # one policy call per session at 70 tokens; round robin of 4: C(4, 2) = 6 matches per group,
    # each tried at most 3 times (a verdict that does not parse is asked again twice)
    assert per["policy"] == Cell(1.0, None, 70.0)
    assert per["judge"].calls == 18 / 4 and per["judge"].completion == 18 / 4 * 40
    exp = compile_file(str(spec_dir / "pair.ask")).ir
    per = session_bounds(exp, exp.games[0])
    assert per["writer"] == Cell(2.0, 800.0, 120.0)  # two asks (one in the `if`), prompts capped at 400


def test_cli_estimate_from_run_prints_estimate_and_spent(spec_dir):
    spec = spec_dir / "dialogue.ask"
    run_dir = _run(spec, spec_dir / "runs", sessions=4)
    res = subprocess.run([sys.executable, "-m", "askspec.cli", "estimate", str(spec), "--from", run_dir,
                          "--gpu", "h100x8", "--set", "n=40"], cwd=spec_dir, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": f"{spec_dir}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    out = res.stdout
    row = next(line.split() for line in out.splitlines() if line.split()[:3] == ["eval", "talk", "asker"])
    assert row[3] == "40"  # --set n=40: 40 sessions
    assert f"spent by {run_dir} (4 sessions)" in out
    assert "GPU:" in out and "left out (model size unknown): asker, solver" in out
    assert "ran another version of the spec" in res.stderr  # n=40 is not the run's n=160
    bad = subprocess.run([sys.executable, "-m", "askspec.cli", "estimate", str(spec), "--gpu", "h900"],
                         cwd=spec_dir, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "--gpu 'h900'" in bad.stderr


def test_check_prints_the_bounds_line(spec_dir):
    res = subprocess.run([sys.executable, "-m", "askspec.cli", "check", str(spec_dir / "arena.ask")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    # 160 policy calls at 70 tokens + 40 groups × 18 judge calls at 40 tokens
    assert "at most 880 model calls, 40,000 completion tokens" in res.stderr


def test_parse_gpu():
    assert parse_gpu("H100x8") == ("h100", 8) and parse_gpu("a100") == ("a100", 1)
    with pytest.raises(ValueError):
        parse_gpu("h100x0")


def test_training_lines_read_the_weights_size_and_count_checkpoints(tmp_path):
    import json
    import struct

    from askspec.runtime.commands.estimate import model_size, render
    from askspec.runtime.commands.train_report import checkpoint_disk

    weights = tmp_path / "tiny"
    weights.mkdir()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [1000, 500], "data_offsets": [0, 1_000_000]},
                         "__metadata__": {}}).encode()
    (weights / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 1_000_000)
    spec = tmp_path / "t.ask"
    spec.write_text(textwrap.dedent(f"""
        experiment t {{ }}
        model m = hf("{weights}") {{ max_tokens = 32 }}
        role solver {{ model = m; trained; memory = none; prompt = "solve {{{{ i }}}}"; reply = boxed }}
        game g for i in range(0, 8) {{
            a = ask solver
            reward solver as r = case {{ a.answer == "1" -> 1.0; else -> 0.0 }}
        }}
        train solver with grpo {{ group = 4; batch = 8; steps = 10; save_every = 4; keep_checkpoints = 2 }}
    """))
    res = compile_file(str(spec))
    assert res.ok
    exp = res.ir
    assert model_size(exp.models[0]) == (500_000, 1_000_000)
    (line,) = estimate(exp).training
    assert (line.steps, line.step_sessions, line.bound_tokens) == (10, 8, 8 * 32)
    # steps 4, 8 and the last: 3 written; the same arithmetic as `askspec run`'s note
    assert line.checkpoint == checkpoint_disk({"solver": (1_000_000, 2_000_000)}, 10, 4, 2)
    assert line.checkpoint[:2] == (3, 2)
    assert any("checkpoints: 3 written, 2 kept" in text for text in render(exp, estimate(exp)))


def test_an_alternating_schedule_charges_each_phase_to_its_own_games():
    """PasoDoble offline: the proposer's phases play `propose` (10 steps × 1 session, 60
    iterations), the solver's the buffer's `practice` (5 steps × 12 sessions): what the
    trainer's schedule.phases plays, not every step on the first phase's games."""
    from askspec.runtime.commands.estimate import stage_sessions

    res = compile_file(str(Path(__file__).resolve().parents[2] / "specs" / "pasodoble.ask"))
    assert res.ok
    rl = dict(stage_sessions(res.ir))["rl"]
    assert rl == {"propose": 600, "practice": 3600}
