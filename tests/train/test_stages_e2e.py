"""Stages end to end on CPU (tests/train/specs/tiny_stages.ask on the tiny random Llama of
tests/conftest.py, 8 new tokens): a supervised cold start (2 sft steps of 2 records), one
GRPO step, then the held-out game against the trained and the initial weights; every
stage's steps, sessions and metrics are checked, and the first sft step's loss against
the cross-entropy of the completion tokens computed here, independently, with the
initial weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_file
from askspec.runtime.store.views import open_store
from askspec.runtime.engine.passk import pass_at_k

SPEC = Path(__file__).parent / "specs" / "tiny_stages.ask"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, e2e, tiny_model) -> Path:
    return e2e.run_to_end(SPEC, tmp_path_factory.mktemp("stages") / "runs", "--set", f'weights="{tiny_model}"')


def test_each_stage_trains_and_plays_what_it_declares(run_dir):
    con = open_store(run_dir)
    steps = con.execute("SELECT step, role, stage, metrics->>'algorithm', metrics->>'phase', loss FROM train_steps "
                        "ORDER BY step").fetchall()
    assert [s[:5] for s in steps] == [(1, "solver", "cold_start", "sft", "cold_start"),
                                      (2, "solver", "cold_start", "sft", "cold_start"),
                                      (3, "solver", "rl", "grpo", "online")]  # evaluation trains nothing
    assert all(s[5] is not None and s[5] > 0 for s in steps[:2])
    sessions = con.execute("SELECT stage, game, weights, count(*) FROM sessions "
                           "GROUP BY ALL ORDER BY ALL").fetchall()
    assert sessions == [("heldout", "test", "initial", 4), ("heldout", "test", "trained", 4), ("rl", "practice", None, 2)]
    assert (run_dir / "checkpoints" / "solver" / "step-4").is_dir()


def test_the_first_sft_step_is_cross_entropy_on_the_completion_tokens(run_dir, tiny_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = str(tiny_model)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    records = compile_file(str(SPEC), {}).ir.datasets[0].items[:2]  # step 1: the first batch of 2
    nll, count = 0.0, 0
    for rec in records:
        prompt = tok.apply_chat_template([{"role": "user", "content": rec["prompt"]}], add_generation_prompt=True,
                                         tokenize=False)
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        c_ids = tok(rec["completion"], add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
        with torch.no_grad():
            logits = model(torch.tensor([p_ids + c_ids])).logits[0]
        logp = logits[len(p_ids) - 1: -1].log_softmax(-1)
        nll -= float(logp.gather(-1, torch.tensor(c_ids)[:, None]).sum())
        count += len(c_ids)
    (loss,) = open_store(run_dir).execute("SELECT loss FROM train_steps WHERE step = 1").fetchone()
    assert loss == pytest.approx(nll / count, rel=1e-4)


def test_metrics_per_stage_with_pass_at_k_from_the_sessions(run_dir):
    done = subprocess.run([sys.executable, "-m", "askspec.cli", "metrics", str(run_dir), "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    keyed = {(r["stage"], r["metric"], tuple(sorted(r["by"].items()))): r for r in rows}
    assert keyed[("cold_start", "loss", (("role", "solver"),))]["n"] == 2
    assert keyed[("rl", "reward_mean", (("role", "solver"),))]["n"] == 1
    # the trainer's advantage diagnostics (Reasoning Arena Fig. 5), from the step's record
    (abs_adv, zero) = open_store(run_dir).execute(
        "SELECT CAST(metrics->>'abs_adv_mean' AS DOUBLE), zero_adv_share FROM train_steps WHERE stage = 'rl'").fetchone()
    assert keyed[("rl", "abs_advantage_mean", (("role", "solver"),))]["value"] == pytest.approx(abs_adv)
    assert keyed[("rl", "nonzero_advantage_share", (("role", "solver"),))]["value"] == pytest.approx(1 - zero)
    con = open_store(run_dir)
    for weights in ("trained", "initial"):
        per_item = con.execute("SELECT group_id, list((vars->>'correct')::BOOLEAN) FROM sessions WHERE stage = 'heldout' "
                               "AND weights = ? GROUP BY ALL", [weights]).fetchall()
        assert len(per_item) == 2 and all(len(v) == 2 for _, v in per_item)
        by = (("game", "test"), ("weights", weights))
        for k in (1, 2):
            want = sum(pass_at_k(2, sum(v), k) for _, v in per_item) / 2
            assert keyed[("heldout", f"pass@{k}", by)]["value"] == pytest.approx(want)
        assert keyed[("heldout", "avg@2", by)]["value"] == pytest.approx(sum(sum(v) / 2 for _, v in per_item) / 2)
        boxed = con.execute("SELECT avg((vars->>'boxed')::BOOLEAN::INT) FROM sessions WHERE stage = 'heldout' "
                            "AND weights = ?", [weights]).fetchone()[0]
        assert keyed[("heldout", "boxed_rate", (("weights", weights),))]["value"] == pytest.approx(boxed)
    table = subprocess.run([sys.executable, "-m", "askspec.cli", "metrics", str(run_dir)], capture_output=True,
                           text=True, timeout=120).stdout
    assert table.splitlines()[0].split()[:3] == ["run_id", "stage", "metric"]
