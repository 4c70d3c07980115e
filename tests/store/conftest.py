"""Fixtures for run-store tests: a factory for small, deterministic runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from askspec.runtime.store.writer import RunWriter

SPEC = 'experiment demo { param probes = 2 }\n'
PROMPT = "Ask about {{ topic }}.\n"


def new_writer(out: Path, *, experiment: str = "demo", **kw) -> RunWriter:
    args = dict(
        experiment=experiment,
        experiment_hash="f00dfeed" * 8,
        ir_json='{"experiment": "%s"}' % experiment,
        spec_files={"demo.ask": SPEC, "prompts/demo/ask.j2": PROMPT},
        seed=7,
        roles={"questioner": {"backend": "replay", "model": "smollm2-135m"},
               "judge": {"backend": "python", "model": None}},
        params={"probes": 2},
        planned_sessions=4,
        argv=["askspec", "run", "demo.ask"],
    )
    args.update(kw)
    return RunWriter.create(out, **args)


def play_session(w: RunWriter, i: int, *, turns: int = 2, finish: bool = True,
                 status: str = "ok", outcome: str | None = "calibrated") -> int:
    """Write one session: started, ``turns`` turns with a turn reward each, a terminal reward."""
    sid = f"s{i}"
    attempt = w.session_started(sid, game="calibrate", group_id=f"g{i // 2}",
                                params={"a": f"m{i % 3}", "b": "m9"}, index=i)
    for t in range(turns):
        role = "questioner" if t % 2 == 0 else "judge"
        w.turn(sid, attempt, turn_index=t, role=role, model="smollm2-135m",
               prompt=[{"role": "user", "content": f"q{i}.{t} attempt {attempt}"}],
               text=f"#Question# what is {i}+{t}?\nline two", parsed={"question": f"{i}+{t}"},
               finish_reason="stop", tokens_in=10 + t, tokens_out=5, latency_ms=1.5)
        w.reward(sid, attempt, role=role, turn_index=t, name="format", value=0.1 * t, kind="turn")
    if finish:
        w.reward(sid, attempt, role="questioner", turn_index=None, name="calibration",
                 value=1.0, kind="terminal")
        w.session_finished(sid, attempt, status=status, outcome=outcome,
                           error=None if status == "ok" else "boom", vars={"i": i})
    return attempt


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers above, as a fixture (works under any pytest import mode)."""
    return SimpleNamespace(new_writer=new_writer, play_session=play_session)


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    """A finished run: 4 sessions (one error), a group, two matches, two train steps."""
    w = new_writer(tmp_path / "runs")
    for i in range(4):
        play_session(w, i, status="error" if i == 3 else "ok",
                     outcome=None if i == 3 else "calibrated")
    w.match("g0", a="s0", b="s1", first_shown="b", verdict="A", outcome=0.9, raw="A is better")
    w.match("g0", a="s1", b="s0", first_shown="a", verdict="B", outcome=0.1, raw="B")
    w.group("g0", route="tournament", stats={"var": 0.0}, members=["s0", "s1"])
    w.train_step("questioner", 1, {"loss": 0.5})
    w.train_step("questioner", 2, {"loss": 0.25})
    w.finish("finished")
    return w.run_dir
