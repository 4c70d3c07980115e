"""Helpers and fixtures for the TUI tests: real runs (Ask-E on the replay backend, Reasoning Arena
on the Python fake models), hand-built Ask-E-shaped runs written with the real
RunWriter, and helpers to read what the app shows."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from askspec.runtime.store.writer import RunWriter

ROOT = Path(__file__).resolve().parents[2]

ASK_E_SCRIPT = {
    "sessions": [
        {   # calibrated: boundary_a matches the key, boundary_b does not
            "questioner": [
                "#Reasoning# plan #Draft# draft \\boxed{4} #Question# What is 2+2? Answer carefully please.",
                "#Reasoning# final plan #Draft# 3+3=6 #Question# What is 3+3 exactly?",
            ],
            "boundary_a": ["Adding gives 4. #Summary# \\boxed{4} I added.", "It is \\boxed{6}."],
            "boundary_b": ["#Summary# I guess \\boxed{5}", "I think \\boxed{7}"],
            "answer_key": ["3+3 = \\boxed{6}"],
        },
        {   # the final reply lacks #Question# even after the recovery prompt
            "questioner": [
                "#Reasoning# r #Draft# d #Question# What is 1+1 in base ten?",
                "I forgot the format entirely.",
                "Still no tags here.",
            ],
            "boundary_a": ["#Summary# \\boxed{2} trivially"],
            "boundary_b": ["no tag but \\boxed{2}"],
            "answer_key": [],
        },
        {   # too easy: both boundary models match the key
            "questioner": [
                "#Reasoning# r #Draft# d #Question# What is 5+5 exactly?",
                "#Reasoning# r #Draft# d #Question# What is 6+6 exactly?",
            ],
            "boundary_a": ["#Summary# \\boxed{10}", "\\boxed{12}"],
            "boundary_b": ["#Summary# \\boxed{10}", "The answer is \\boxed{12}."],
            "answer_key": ["\\boxed{12}"],
        },
    ]
}

_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def freeze(run_dir: Path, run_id: str) -> Path:
    """Give a run a fixed id and fixed timestamps (for snapshots): rename the directory
    and rewrite the id and every timestamp in its manifest and event files."""
    old = json.loads((run_dir / "manifest.json").read_text())["run_id"]
    for f in [run_dir / "manifest.json", *sorted((run_dir / "events").glob("*.ndjson"))]:
        text = f.read_text(encoding="utf-8").replace(old, run_id)
        f.write_text(_TS.sub("2026-01-02T03:04:05.000000Z", text), encoding="utf-8")
    target = run_dir.with_name(run_id)
    run_dir.rename(target)
    return target


def _writer(out: Path, experiment: str, **kw) -> RunWriter:
    args = dict(experiment=experiment, experiment_hash="5eed" * 16, ir_json="{}",
                spec_files={f"{experiment}.ask": f"experiment {experiment} {{}}\n"}, seed=0,
                roles={"questioner": {"model": "policy", "trained": True},
                       "boundary_a": {"model": None, "trained": False},
                       "boundary_b": {"model": None, "trained": False},
                       "answer_key": {"model": "key", "trained": False}},
                params={"probes": 1}, planned_sessions=6, argv=["askspec", "run"], flush_interval=0)
    args.update(kw)
    return RunWriter.create(out, **args)


PAIRS = [("small", "mid"), ("small", "large"), ("mid", "large")]


def build_demo_run(out: Path, run_id: str = "20260102-030405-ask_e-demo01") -> Path:
    """An Ask-E-shaped finished run written with the real RunWriter: six sessions over
    three boundary pairs (one errored, one with a recovery turn), a tournament group
    with matches, and training steps; the spec's IR is the compiled specs/ask_e.ask."""
    from askspec.ir.canonical import to_json
    from askspec.lang.compiler import compile_file

    ir = to_json(compile_file(str(ROOT / "specs" / "ask_e.ask")).ir)
    w = _writer(out, "ask_e", ir_json=ir)
    outcomes = ["calibrated", "too_easy", "too_hard", "calibrated", "calibrated", None]
    for i in range(6):
        a, b = PAIRS[i % 3]
        sid = f"s{i:06d}"
        att = w.session_started(sid, game="calibrate", group_id="g0" if i < 4 else None,
                                params={"a": a, "b": b}, index=i)
        q = f"What is {i} plus {i + 1}, in words?"
        system = {"role": "system", "content": "You are a questioner."}
        user = {"role": "user", "content": "Write a probing question."}
        qtext = f"#Reasoning# think {i} #Draft# draft \\boxed{{{2 * i + 1}}} #Question# {q}"
        w.turn(sid, att, turn_index=0, role="questioner", model="policy", prompt=[system, user], text=qtext,
               parsed={"reasoning": f"think {i}", "draft": f"draft \\boxed{{{2 * i + 1}}}", "question": q,
                       "answer": str(2 * i + 1), "parsed": True, "truncated": False},
               finish_reason="stop", tokens_in=40, tokens_out=30 + i, latency_ms=120.0 + i)
        for t, role, ans in ((1, "boundary_a", 2 * i + 1), (2, "boundary_b", 2 * i)):
            w.turn(sid, att, turn_index=t, role=role, model=f"boundary_{a if role == 'boundary_a' else b}",
                   prompt=[{"role": "user", "content": q + "\n\nEnd with #Summary#."}],
                   text=f"Working. #Summary# \\boxed{{{ans}}} because I added.",
                   parsed={"summary": f"\\boxed{{{ans}}} because I added.", "answer": str(ans), "parsed": True,
                           "truncated": False}, finish_reason="stop", tokens_in=20, tokens_out=12, latency_ms=80.0)
        if i == 2:  # an untagged reply and its recovery turn
            bad = [system, user, {"role": "assistant", "content": qtext},
                   {"role": "user", "content": "Final question, please."}]
            w.turn(sid, att, turn_index=3, role="questioner", model="policy", prompt=bad, text="No tags at all.",
                   parsed={"question": None, "answer": "all", "parsed": False, "truncated": False},
                   finish_reason="stop", tokens_in=60, tokens_out=5, latency_ms=90.0)
            rec = bad + [{"role": "assistant", "content": "No tags at all."},
                         {"role": "user", "content": "You did not use the #Question# tag. Try again."}]
            w.turn(sid, att, turn_index=4, role="questioner", model="policy", prompt=rec, text="Still none.",
                   parsed={"question": None, "answer": "none", "parsed": False, "truncated": False},
                   finish_reason="stop", tokens_in=70, tokens_out=3, latency_ms=95.0)
            w.reward(sid, att, role="questioner", turn_index=3, name="format", value=-0.05, kind="turn")
        if outcomes[i] is None:
            w.session_finished(sid, att, status="error", outcome=None, error="boundary_b: model call failed: timeout",
                               vars={})
            continue
        value = {"calibrated": 1.0, "too_easy": 0.2, "too_hard": -0.2}[outcomes[i]]
        w.reward(sid, att, role="questioner", turn_index=None, name="calibration", value=value, kind="terminal")
        w.session_finished(sid, att, status="ok", outcome=outcomes[i], error=None,
                           vars={"missing_question": i == 2})
    members = [f"s{i:06d}" for i in range(4)]
    routed = [0.6, 0.0, 1.0, 0.4]  # the tournament's rewards replace the members' calibration rewards
    for sid, value in zip(members, routed):
        w.reward(sid, 1, role="questioner", turn_index=None, name="tournament", value=value, kind="terminal")
    for k, (x, y, first, verdict, outcome) in enumerate([(1, 0, 0, "A", 0.0), (2, 0, 2, "B", 0.0),
                                                          (3, 1, 3, "Tie", 0.5)]):
        w.match("g0", a=members[x], b=members[y], first_shown=members[first], verdict=verdict, outcome=outcome,
                raw=f"Comparing both traces ({k}). The verdict is \\boxed{{{verdict}}}")
    w.group("g0", route="tournament:arena",
            stats={"count": 4, "mean": 0.5, "var": 0.26, "role": "questioner", "strengths": [0.1, -0.2, 0.3, 0.0],
                   "routed": routed, "judge_calls": 3, "pairing": "live", "aggregate": "bradley_terry"},
            members=members)
    for step in range(1, 6):
        w.train_step("questioner", step, {"reward": 0.1 * step, "loss": 1.0 / step, "kl": 0.01 * step})
    w.finish("finished")
    return freeze(w.run_dir, run_id)


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory) -> Path:
    """A folder with two hand-built runs (frozen ids and times) and nothing else."""
    out = tmp_path_factory.mktemp("demo") / "runs"
    build_demo_run(out, "20260102-030405-ask_e-demo01")
    build_demo_run(out, "20260102-030406-ask_e-demo02")
    return out


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory) -> Path:
    """Runs made by askspec itself: Ask-E on the replay backend (3 sessions, 1 probing
    round) and Reasoning Arena on the Python fake models (one tournament group)."""
    from askspec.runtime.commands.run import run_spec

    tmp = tmp_path_factory.mktemp("real")
    out = tmp / "runs"
    replay = tmp / "replay.json"
    replay.write_text(json.dumps(ASK_E_SCRIPT))
    rc, ask_e = asyncio.run(run_spec(str(ROOT / "specs" / "ask_e.ask"), eval_only=True, out=str(out), replay=str(replay),
                                     sessions=3, set=["probes=1"]))
    assert rc == 0
    time.sleep(0.01)  # distinct run ids by start time
    rc, arena = asyncio.run(run_spec(str(ROOT / "specs" / "reasoning_arena.ask"), eval_only=True, out=str(out), sessions=8,
                                     model=["policy=python:fake_models:always_one",
                                            "judge=python:fake_models:judge_first"]))
    assert rc == 0
    return out


def screen_text(app) -> str:
    """What the terminal shows right now, as plain text (one line per row)."""
    return "\n".join(strip.text.rstrip() for strip in app.screen._compositor.render_strips())


async def wait_until(pilot, condition, timeout: float = 15.0, what: str = "") -> None:
    """Let the app run until ``condition()`` holds (workers are threads: poll)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if condition():
            await pilot.pause(0.05)
            return
    raise AssertionError(f"timed out waiting for {what or condition}:\n{screen_text(pilot.app)}")


async def type_text(pilot, text: str) -> None:
    """Type ``text`` as a fast typist does: one key event a character, in order, then let
    the app run until it is idle. (Pilot.press waits for the app to go idle after every
    key, about 60 ms a character: a typed query took seconds.)"""
    from textual import events
    from textual.keys import _character_to_key

    for char in text:
        event = events.Key(_character_to_key(char), char)
        event.set_sender(pilot.app)
        pilot.app._driver.send_message(event)
    await pilot.pause()


def shows(app, *needles: str):
    return lambda: all(n in screen_text(app) for n in needles)


GRPO_REWARDS = [  # (format, answer) per member, per group: what a GRPO step of arith.ask might score
    [(0.5, 0.5), (0.5, 0.0), (0.5, 0.0), (0.0, 0.0)],  # a spread: non-zero advantages
    [(-0.4, 0.0)] * 4,  # all equal (-0.4 each): zero advantage, its mean exactly -0.4
    [(0.1, 0.0), (0.2, 0.0), (-0.3, 0.0), (0.0, 0.0)],  # rewards that cancel: mean -2.78e-17 in floats
]


def build_grpo_run(out: Path, run_id: str = "20260102-030405-arith-grpo01", shift: float = 0.0,
                   seed: int = 0, overrides: dict | None = None, stages: bool = False) -> Path:
    """An arith.ask-shaped GRPO run written with the real RunWriter, as the trainer writes
    one: 2 steps of 3 groups of 4 sessions (``params`` bind the data item, ``step`` is the
    session's training step, ``vars`` hold the spec's variables, routes ``none``), per-step
    train metrics with the trainer's bookkeeping, and the compiled specs/arith.ask as its
    IR. ``shift`` moves
    every reward and curve (a second run to compare); ``stages``: step 1 is stage
    ``warmup``, step 2 ``main`` (the sessions' ``stage``, as a spec with stages has)."""
    from askspec.ir.canonical import to_json
    from askspec.lang.compiler import compile_file

    ir = to_json(compile_file(str(ROOT / "specs" / "arith.ask")).ir)
    w = RunWriter.create(out, experiment="arith", experiment_hash=("ab12" if shift else "5eed") * 16, ir_json=ir,
                         spec_files={"arith.ask": (ROOT / "specs" / "arith.ask").read_text()}, seed=seed,
                         roles={"solver": {"model": "policy", "trained": True}}, params={"steps": 2, "group_size": 4},
                         planned_sessions=24, argv=["askspec", "run", "arith.ask"], flush_interval=0)
    w.manifest["overrides"] = overrides or {}  # (as `askspec run --set` records them)
    w.manifest["run_options"] = {"backend": "hf", "profile": "cpu" if shift else None, "concurrency": 8}
    k = 0
    for step in (1, 2):
        for g, members in enumerate(GRPO_REWARDS):
            gid = f"solve-t{step:06d}-e{g:03d}"
            ids = []
            for m, (fmt, ans) in enumerate(members):
                sid = f"s{k:06d}"
                item = {"id": f"p{g + 3 * (step - 1)}", "question": f"{g}+{m}", "answer": str(g + m)}
                stage = ("warmup" if step == 1 else "main") if stages else None
                att = w.session_started(sid, game="solve", group_id=gid, params={"item": item}, index=k, step=step,
                                        stage=stage)
                w.turn(sid, att, turn_index=0, role="solver", model="policy",
                       prompt=[{"role": "user", "content": f"What is {g}+{m}?"}], text=f"\\boxed{{{g + m}}}",
                       parsed={"answer": str(g + m)}, finish_reason="stop", tokens_in=20 + m, tokens_out=5 + g,
                       latency_ms=50.0)
                w.reward(sid, att, role="solver", turn_index=None, name="format", value=fmt + shift, kind="terminal")
                w.reward(sid, att, role="solver", turn_index=None, name="answer", value=ans, kind="terminal")
                w.session_finished(sid, att, status="ok", outcome=None, error=None,
                                   vars={"item": item, "s": f"\\boxed{{{g + m}}}",
                                         "has_box": fmt > 0, "correct": ans > 0, "questions": m + 1})
                ids.append(sid)
                k += 1
            w.group(gid, route="none", stats={"count": 0}, members=ids)
        w.train_step("solver", step, {
            "trajectories": 12, "groups": 3, "lr": 2e-05, "reward_mean": 0.2 * step + shift, "reward_std": 0.3,
            "zero_var_groups": 1, "tokens": 72, "zero_adv_share": 0.3333, "abs_adv_mean": 0.6, "loss": 0.5 / step,
            "clip_frac": 0.0, "kl": 0.001 * step, "grad_norm": 1.5 / step, "epochs": 1, "seconds_update": 0.05,
            "step": step, "iteration": 1, "phase": "online", "stage": None, "algorithm": "grpo",
            "generated_tokens": 72, "sessions": 12, "seconds_play": 0.1, "seconds": 0.15, "policy_version": step - 1})
    w.finish("finished")
    return freeze(w.run_dir, run_id)
