"""Reasoning Arena's configurations (issue 15, item 3) on the replay backend: which route
each `--set routing=...` takes for a diverse and a non-diverse group, the paper's
diagnostics as metrics (share of groups routed, effective judge calls, share of non-zero
advantages; reasoning_arena.txt Table 2, Fig. 5), and the call bounds `askspec compile
--format text` prints (App. B: round robin 28 judge calls for N = 8, live at most 18)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.runtime.commands.run import run_spec
from askspec.runtime.engine.metrics import run_metrics
from askspec.runtime.store.views import open_store

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "reasoning_arena.ask"
FIRST = [json.loads(line) for line in (ROOT / "specs" / "data" / "math_problems.jsonl").read_text().splitlines()[:2]]


def recording(judge_reply: str) -> dict:
    """Groups of 4 on the first two problems: the first diverse (2 right, 2 wrong), the
    second all correct (non-diverse); the judge's replies sit with each group's first member."""
    a0, a1 = FIRST[0]["answer"], FIRST[1]["answer"]
    first = [f"\\boxed{{{a0}}}", f"\\boxed{{{a0}}}", "\\boxed{-1}", "\\boxed{-2}"]
    sessions = [{"policy": [t], "judge": [judge_reply] * 6} for t in first]
    sessions += [{"policy": [f"Step {k}: so \\boxed{{{a1}}}"], "judge": [judge_reply] * 6} for k in range(4)]
    return {"sessions": sessions}


def run(tmp_path: Path, routing: str, judge_reply: str = "Response A is better. \\boxed{A}"):
    replay = tmp_path / f"{routing}.json"
    replay.write_text(json.dumps(recording(judge_reply)))
    rc, run_dir = asyncio.run(run_spec(str(SPEC), eval_only=True, out=str(tmp_path / routing), replay=str(replay),
                                       sessions=8, set=["group_size=4", f"routing={routing}"], quiet=True))
    assert rc == 0
    con = open_store(run_dir)
    routes = [r[0] for r in con.execute("select route from groups order by group_id").fetchall()]
    metrics = {r["metric"]: r["value"] for r in run_metrics(run_dir)[0]}
    return routes, metrics, con


@pytest.mark.parametrize("routing, routes, routed, calls, nonzero", [
    ("live", ["keep", "tournament:arena"], 0.5, (0 + 6) / 2, 1.0),                # 1 + 2 + 3 matches for N = 4
    ("round_robin", ["keep", "tournament:arena_rr"], 0.5, (0 + 6) / 2, 1.0),      # C(4, 2) = 6
    ("arena_rl", ["tournament:arena_rr", "tournament:arena_rr"], 1.0, 6.0, 1.0),  # every group, no routing
    ("adaptive_pointwise", ["keep", "judge:adaptive_pointwise"], 0.5, (0 + 4) / 2, 0.5),
    ("rlvr", ["keep", "resample"], 0.0, 0.0, 0.5),
])
def test_each_configuration_routes_as_the_paper_says(tmp_path, routing, routes, routed, calls, nonzero):
    reply = "\\boxed{1}" if "pointwise" in routing else "Response A is better. \\boxed{A}"
    got, metrics, con = run(tmp_path, routing, reply)
    assert got == routes
    assert metrics["routed_share"] == pytest.approx(routed)
    assert metrics["effective_judge_calls"] == pytest.approx(calls)
    # the diverse group's four traces have non-zero advantages (rewards 1, 1, 0, 0), kept or
    # tournament-scored; a tournament spreads the non-diverse group's rewards too, while a
    # resampled group gives no gradient and a pointwise judge scoring all four 1 neither
    assert metrics["nonzero_advantage_share"] == pytest.approx(nonzero)


def test_rlaif_scores_every_group_pointwise(tmp_path):
    got, metrics, _ = run(tmp_path, "rlaif", "Based on my evaluation, the final overall score should be: \\boxed{0.5}")
    assert got == ["judge:rlaif", "judge:rlaif"]
    assert metrics["routed_share"] == 1.0 and metrics["effective_judge_calls"] == 4.0
    assert metrics["nonzero_advantage_share"] == 0.0  # the judge gave every trace 0.5


def test_live_tournament_advantages_follow_the_fitted_rewards(tmp_path):
    _, metrics, con = run(tmp_path, "live")
    routed = con.execute("select value from rewards where name = 'tournament'").fetchall()
    values = [v for (v,) in routed]
    mean = sum(values) / len(values)
    expected = (4 + sum(abs(v - mean) > 1e-12 for v in values)) / 8
    assert metrics["nonzero_advantage_share"] == pytest.approx(expected)
    assert max(values) == 1.0 and min(values) == 0.0  # min-max normalised (§4)


def _eq2(rewards: list[float]) -> list[float]:
    """Reasoning Arena Eq. 2, written out here: (r − μ) / (σ + ε), population σ, ε = 1e-4."""
    mu = sum(rewards) / len(rewards)
    sigma = (sum((r - mu) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return [(r - mu) / (sigma + 1e-4) for r in rewards]


def test_mean_absolute_advantage_is_eq_2_on_the_rewards_after_routing(tmp_path):
    _, metrics, con = run(tmp_path, "live")
    routed = [v for (v,) in con.execute("select value from rewards where name = 'tournament' order by session_id").fetchall()]
    diverse = _eq2([1.0, 1.0, 0.0, 0.0])  # the kept group: the verifier's rewards
    expected = sum(abs(a) for a in diverse + _eq2(routed)) / 8
    assert metrics["mean_abs_advantage"] == pytest.approx(expected)
    assert 0.9 < abs(diverse[0]) < 1.0  # 0.5 / (0.5 + 1e-4)
    _, metrics, _ = run(tmp_path, "rlvr")  # the resampled group gives no advantage
    assert metrics["mean_abs_advantage"] == pytest.approx(sum(abs(a) for a in diverse) / 8)


def test_compile_text_shows_the_papers_call_bounds():
    out = subprocess.run([sys.executable, "-m", "askspec.cli", "compile", str(SPEC), "--format", "text"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "judge calls per routed group of 8" in out.stdout
    assert "tournament arena_rr, round_robin: = 28 (≤ 84)" in out.stdout       # C(8, 2)
    assert "tournament arena, live(best, worst, median): ≤ 18 (≤ 54)" in out.stdout  # 1 + 2 + 3·5
    assert "judge rlaif, pointwise: = 8 (≤ 24)" in out.stdout
    assert "max_tokens=81920" in out.stdout and "max_tokens=32768" in out.stdout  # App. B token limits
    smoke = subprocess.run([sys.executable, "-m", "askspec.cli", "compile", str(SPEC), "--format", "text", "--set",
                            "group_size=4"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "tournament arena_rr, round_robin: = 6 (≤ 18)" in smoke.stdout
    assert "tournament arena, live(best, worst, median): ≤ 6 (≤ 18)" in smoke.stdout
