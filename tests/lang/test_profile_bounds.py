"""`askspec compile --format text --profile NAME` prints each configuration's call and step
bounds as the papers give them (issue 15, acceptance): Reasoning Arena's round robin is
C(N, 2) judge calls per routed group (28 for the paper's N = 8) and the live tournament at
most 1 + 2 + 3(N - 3) (18 for N = 8); Ask-E's questioner asks k + 1 times (each with one
recovery retry) and the boundaries answer k + 1 times; AskBench's judge runs once per
turn (with its JSON retries) over 3 or 2 turns; SOAR's grounded configuration has the
inner loop and Intrinsic-T has none. Each profile's lines are pinned here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SPECS = Path(__file__).resolve().parents[2] / "specs"

CASES = [
    ("reasoning_arena", "paper", [
        "profile: paper",
        "    judge: ≤ 84 per group of 8 (route tournament arena_rr, round_robin)",
        "    tournament arena_rr, round_robin: = 28 (≤ 84)",  # C(8, 2), App. B
        "    tournament arena, live(best, worst, median): ≤ 18 (≤ 54)",  # 1 + 2 + 3·5, App. B
        "    judge adaptive_pointwise, pointwise: = 8 (≤ 24)",
        "  stage rl train: the schedule (online), steps 1–1500",
    ], ["policy_model: hf('smollm2-135m-instruct') max_tokens=81920", "judge_model: hf('smollm2-135m-instruct') max_tokens=32768"]),
    ("reasoning_arena", "cpu", [
        "profile: cpu",
        "    tournament arena_rr, round_robin: = 6 (≤ 18)",  # C(4, 2)
        "    tournament arena, live(best, worst, median): ≤ 6 (≤ 18)",  # 1 + 2 + 3
        "  stage rl train: the schedule (online), steps 1–2",
    ], ["max_tokens=512"]),
    ("ask_e", "benchmark", [
        "profile: benchmark", "    questioner: ≤ 10", "    boundary_a: ≤ 5", "    boundary_b: ≤ 5", "    answer_key: ≤ 1",
    ], []),
    ("ask_e", "training", [
        "profile: training", "    questioner: ≤ 8", "    boundary_a: ≤ 4", "    boundary_b: ≤ 4", "    answer_key: ≤ 1",
        "  stage rl train: the schedule (online), steps 1–200",
    ], ["pass@8, avg@8 of 'correct'; step 201"]),
    ("askbench", "standard", ["profile: standard", "    assistant: ≤ 3", "    judge: ≤ 9", "    user: ≤ 3"], []),
    ("askbench", "hard", ["profile: hard", "    assistant: ≤ 2", "    judge: ≤ 6", "    user: ≤ 2"], []),
    ("soar", "grounded", [
        "profile: grounded",
        "  inner loop: 4 dataset(s) × 4 copies of student × 10 step(s) (15 after a promotion) = 160-240 inner "
        "update(s) per outer step, 256 session(s) each; practice: student ≤ 1 per session",
        "  stage rl train: the schedule (nested), keeping the promoted student of best accuracy, steps 1–200",
    ], ["pass@1, pass@4, pass@8, pass@16, pass@32, avg@32 of 'correct'; step 201",
        "then keeping its weights at the start of its reward plateau over the whole curve (a centred window 25, "
        "fraction 0.15; weights kept every 50 step(s)), the evaluations after it averaged over the kept checkpoints "
        "of the 200 steps from it, steps 202–1701"]),
    ("soar", "intrinsic_t", [
        "profile: intrinsic_t",
        "  200 outer step(s); each updates teacher once; teach: student ≤ 8192, student_greedy ≤ 64, teacher ≤ 1280 per "
        "session; write: teacher ≤ 640 per session",
    ], []),
]


def text(spec: str, profile: str) -> str:
    done = subprocess.run([sys.executable, "-m", "askspec.cli", "compile", str(SPECS / f"{spec}.ask"), "--profile",
                           profile, "--format", "text"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("spec, profile, lines, fragments", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_each_profile_prints_the_papers_bounds(spec, profile, lines, fragments):
    out = text(spec, profile)
    have = out.splitlines()
    for line in lines:
        assert line in have, f"{spec} --profile {profile}: missing {line!r}"
    for frag in fragments:
        assert frag in out, f"{spec} --profile {profile}: missing {frag!r}"


def test_intrinsic_t_has_no_inner_loop():
    assert "inner loop:" not in text("soar", "intrinsic_t")
