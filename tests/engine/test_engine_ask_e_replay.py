"""End to end: the Ask-E spec on the replay backend, recorded and read back with DuckDB.

Scripted replies make every step checkable: the parsed question is forwarded (cut to
question_words), boundary summaries are built, final answers extracted and compared
with equiv, the outcome decided, and a final reply without #Question# ends the session
as too_hard with no boundary call on the final round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "ask_e.ask"

SCRIPT = {
    "sessions": [
        {   # calibrated: boundary_a matches the key, boundary_b does not
            "questioner": [
                "#Reasoning# plan #Draft# draft \\boxed{4} #Question# What is 2+2? Answer carefully please.",
                "#Reasoning# final plan #Draft# 3+3=6 #Question# What is 3+3?",
            ],
            "boundary_a": ["Adding gives 4. #Summary# \\boxed{4} I added.", "It is \\boxed{6}."],
            "boundary_b": ["#Summary# I guess \\boxed{5}", "I think \\boxed{7}"],
            "answer_key": ["3+3 = \\boxed{6}"],
        },
        {   # the final reply lacks #Question# even after the recovery prompt
            "questioner": [
                "#Reasoning# r #Draft# d #Question# What is 1+1?",
                "I forgot the format entirely.",
                "Still no tags here.",
            ],
            "boundary_a": ["#Summary# \\boxed{2} trivially"],
            "boundary_b": ["no tag but \\boxed{2}"],
            "answer_key": [],
        },
        {   # too easy: both boundary models match the key; the probe has no #Draft# (a question, so no recovery)
            "questioner": [
                "#Reasoning# r #Question# What is 5+5?",
                "#Reasoning# r #Draft# d #Question# What is 6+6?",
            ],
            "boundary_a": ["#Summary# \\boxed{10}", "\\boxed{12}"],
            "boundary_b": ["#Summary# \\boxed{10}", "The answer is \\boxed{12}."],
            "answer_key": ["\\boxed{12}"],
        },
    ]
}


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(SCRIPT))
    cmd = [sys.executable, "-m", "askspec.cli", "run", str(SPEC), "--eval-only", "--replay", str(replay), "--sessions", "3",
           "--set", "probes=1", "--set", "question_words=3", "--out", str(tmp_path / "runs"), "--quiet", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("askE")
    proc = _run(tmp)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


def _q(run_dir: Path, sql: str):
    from askspec.runtime.store.views import open_store

    con = open_store(str(run_dir))
    return con.execute(sql).fetchall()


def test_sessions_and_outcomes(run_dir):
    rows = _q(run_dir, "select session_id, status, outcome, error from sessions order by session_id")
    assert rows == [("s000000", "ok", "calibrated", None), ("s000001", "ok", "too_hard", None),
                    ("s000002", "ok", "too_easy", None)]


def test_question_forwarded_parsed_and_truncated(run_dir):
    rows = _q(run_dir, "select prompt from turns where session_id='s000000' and role='boundary_a' order by turn_index")
    first = json.loads(rows[0][0]) if isinstance(rows[0][0], str) else rows[0][0]
    user = first[-1]["content"]
    # only the #Question# section, cut to 3 words, reaches the boundary model
    assert user.startswith("What is 2+2?")
    assert "Answer carefully" not in user and "plan" not in user and "draft" not in user


def test_summaries_reach_questioner(run_dir):
    rows = _q(run_dir, "select prompt from turns where session_id='s000000' and role='questioner' order by turn_index")
    final_prompt = json.loads(rows[-1][0]) if isinstance(rows[-1][0], str) else rows[-1][0]
    text = final_prompt[-1]["content"]
    assert "\\boxed{4} I added." in text  # text after #Summary# for boundary_a
    assert "\\boxed{5}" in text  # boundary_b summary
    assert "Adding gives 4" not in text  # the chain of thought is never forwarded


def test_rewards(run_dir):
    rows = dict(((s, n), v) for s, n, v in _q(run_dir, "select session_id, name, value from rewards where role='questioner'"))
    assert rows[("s000000", "calibration")] == pytest.approx(1.0)
    # too_hard and two untagged questioner turns (final + recovery): -0.2 - 0.05*2
    assert rows[("s000001", "calibration")] == pytest.approx(-0.3)
    assert ("s000001", "diversity") not in rows
    # too easy, and the probe without #Draft# is penalised too: §5.1 counts every turn that
    # lacks one of the required tags, not only a missing #Question#: 0.2 - 0.05
    assert rows[("s000002", "calibration")] == pytest.approx(0.15)


def test_no_boundary_call_on_missing_final_question(run_dir):
    rows = _q(run_dir, "select role, count(*) from turns where session_id='s000001' group by role order by role")
    assert dict(rows) == {"questioner": 3, "boundary_a": 1, "boundary_b": 1}


def test_recovery_prompt_is_the_malformed_variant(run_dir):
    rows = _q(run_dir, "select prompt from turns where session_id='s000001' and role='questioner' order by turn_index")
    last = json.loads(rows[-1][0]) if isinstance(rows[-1][0], str) else rows[-1][0]
    assert "you did not use the #Question# tag" in last[-1]["content"]
    assert last[-2] == {"role": "assistant", "content": "I forgot the format entirely."}


def test_replay_running_out_marks_session_error(tmp_path):
    short = {"sessions": [SCRIPT["sessions"][0]]}
    replay = tmp_path / "short.json"
    replay.write_text(json.dumps(short))
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(SPEC), "--eval-only", "--replay", str(replay), "--sessions", "2",
                           "--set", "probes=1", "--out", str(tmp_path / "runs"), "--quiet"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    rows = _q(run_dir, "select session_id, status, error from sessions order by session_id")
    assert rows[0][1] == "ok"
    assert rows[1][1] == "error" and "session" in rows[1][2].lower()


def test_metrics_by_pair(run_dir):
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "metrics", str(run_dir), "--format", "json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = {r["metric"]: r for r in json.loads(proc.stdout)}
    pair = {"a": "boundary_small", "b": "boundary_sympy"}
    # the missing-question session is too_hard for its reward but counted only as missing
    # (Ask-E Fig. 2): the four rates sum to 1
    for name, value in {"calibration_rate": 1 / 3, "too_easy_rate": 1 / 3, "too_hard_rate": 0.0,
                        "missing_rate": 1 / 3}.items():
        assert rows[name]["by"] == pair and rows[name]["n"] == 3
        assert rows[name]["value"] == pytest.approx(value)


def test_diversity_bonus_times_the_clipped_calibration_reward(run_dir):
    """App. E: the bonus times max(calibration reward, 0): whole when calibrated, 0.2 of it
    when too easy."""
    rows = dict(((s, n), v) for s, n, v in _q(run_dir, "select session_id, name, value from rewards where role='questioner'"))
    bonus = {sid: json.loads(v)["novelty_bonus"] for sid, v in _q(run_dir, "select session_id, vars from sessions")
             if "novelty_bonus" in json.loads(v)}
    assert bonus["s000000"] > 0 and rows[("s000000", "diversity")] == pytest.approx(bonus["s000000"])  # calibrated
    assert rows[("s000002", "calibration")] == pytest.approx(0.2 - 0.05)  # its probe lacks #Draft#
    assert bonus["s000002"] > 0 and rows[("s000002", "diversity")] == pytest.approx(0.2 * bonus["s000002"])  # too easy
