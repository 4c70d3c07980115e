"""Asynchronous rollouts end to end (`max_staleness = 1`, issue #26 item 3): step t + 1 is
played while step t's update runs, so its rollouts are sampled one update before the
weights they train; every rollout's recorded version is within the bound, and `kill -9` +
`--resume` trains every step exactly once and never on a rollout staler than the bound.
With stages, a stage boundary drains the overlap: the stage runs by the current weights
and the train stage's first step is on-policy. On the suite's tiny random Llama
(tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.runtime.store.views import open_store

pytestmark = pytest.mark.slow  # builds a tiny model with SmolLM2's tokenizer (the converted GGUF)

STEPS = 5
# the kill test's run: long enough that a kill polled every 0.2 s lands mid-run on an idle
# machine too (a tiny-model step takes ~0.1 s there; with 5 steps the run could end first)
KILL_STEPS = 20
SPEC = """model m = hf("{model}") {{ max_tokens = 3; temperature = 1.0 }}
role a {{ model = m; memory = none; prompt = "a + b"; trained }}
game g for i in range(0, 8) {{
    x = ask a
    reward a = len(x.text)
}}
train a with grpo {{ group = 2; steps = {steps}; save_every = 1; keep_checkpoints = 2; lr = 0.01; {extra} }}
"""


# SPEC's game and train block with stages around the train stage (only one is allowed,
# E408): two sft steps, an evaluation by their weights, the train stage, then an
# evaluation against the trained and the initial weights
STAGES = """data cold = [{{prompt: "1 + 1", completion: "2"}}, {{prompt: "2 + 2", completion: "4"}}]
game held for i in range(0, 2) {{
    x = ask a
    long = len(x.text) > 4
    reward a = len(x.text)
}}
stage warm sft {{ role = a; data = cold; steps = 2; batch = 2 }}
stage before evaluate {{ games = [held]; samples = 1; score = long; weights = [trained] }}
stage rl train
stage after evaluate {{ games = [held]; samples = 2; k = [1, 2]; score = long }}
"""
FIRST_RL = 4  # steps 1-2 warm, 3 before, then rl


def spec(folder: Path, model: Path, extra: str = "max_staleness = 1", steps: int = STEPS,
         stages: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "t.ask"
    path.write_text(SPEC.format(model=model, steps=steps, extra=extra) + (STAGES.format() if stages else ""))
    return path


def versions(run: Path) -> tuple[list[tuple], list[tuple]]:
    """(step, rollout policy_version) of every rollout the views show, and (step, trained
    version, sampling version, stale share) of every train step."""
    con = open_store(run)
    rollouts = con.execute("SELECT step, policy_version FROM rollouts ORDER BY step").fetchall()
    steps = con.execute("SELECT step, (metrics->>'policy_version')::INT, (metrics->>'sampling_version')::INT, "
                        "(metrics->>'stale_share')::DOUBLE FROM train_steps ORDER BY step").fetchall()
    return rollouts, steps


def within_bound(rollouts: list[tuple], steps: list[tuple], k: int = 1) -> None:
    trained = {step: v for step, v, sv, _ in steps if sv is not None}  # an sft step plays nothing
    assert len(rollouts) == 2 * len(trained) and {s for s, _ in rollouts} == set(trained)
    for step, v in rollouts:
        assert trained[step] - k <= v <= trained[step], (step, v, trained[step])


def test_each_rollout_is_sampled_within_the_bound(tiny_model, tmp_path, e2e):
    run = e2e.run_here(spec(tmp_path, tiny_model), tmp_path / "runs")
    rollouts, steps = versions(run)
    within_bound(rollouts, steps)
    # step 1 is played before any update; step t ≥ 2 by the weights of before step t − 1's update
    assert sorted(set(rollouts)) == [(1, 0)] + [(t, t - 2) for t in range(2, STEPS + 1)]
    assert [(s, v, sv) for s, v, sv, _ in steps] == [(t, t - 1, max(0, t - 2)) for t in range(1, STEPS + 1)]
    assert [share for *_, share in steps] == [0.0] + [1.0] * (STEPS - 1)
    con = open_store(run)
    ratios = con.execute("SELECT (metrics->>'is_ratio_mean')::DOUBLE, (metrics->>'is_truncated_share')::DOUBLE "
                         "FROM train_steps ORDER BY step").fetchall()
    assert ratios[0] == (1.0, 0.0) and all(r > 0 and 0 <= share <= 1 for r, share in ratios)
    assert any(r != 1.0 for r, _ in ratios[1:])  # a stale step's weights differ from the sampler's


def test_kill_9_then_resume_trains_every_step_once_within_the_bound(tiny_model, tmp_path, e2e):
    out = tmp_path / "runs"
    e2e.kill_run_when(e2e.cmd("run", str(spec(tmp_path, tiny_model, steps=KILL_STEPS)), "--out", str(out), "--quiet"),
                      out,
                      lambda o: s if (s := e2e.latest_step(o)) is not None and s >= 2 else None, 300)
    run = e2e.only_run(out)
    killed_at = e2e.latest_step(out)
    assert killed_at is not None and killed_at < KILL_STEPS
    e2e.resume_here(run)  # in this process: the killed one is gone
    rollouts, steps = versions(run)
    assert [s for s, *_ in steps] == list(range(1, KILL_STEPS + 1))  # every step exactly once
    assert [v for _, v, _, _ in steps] == list(range(KILL_STEPS))
    within_bound(rollouts, steps)
    state = json.loads((run / "checkpoints" / "a" / f"step-{KILL_STEPS}" / "trainer_state.json").read_text())
    assert state["version"] == KILL_STEPS
    con = open_store(run)
    assert con.execute("SELECT count(*), count(DISTINCT session_id) FROM sessions WHERE status = 'ok'").fetchone() == (
        2 * KILL_STEPS, 2 * KILL_STEPS)


def sampler_logprobs(weights: Path, rollouts: list[tuple]) -> list[float]:
    """The log-probs `weights` give each rollout's completion tokens (temperature 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32).eval()
    out = []
    for prompt, completion in rollouts:
        with torch.no_grad():
            logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0]
        logp = logits[len(prompt) - 1: -1].log_softmax(-1)
        out += [float(logp[i, t]) for i, t in enumerate(completion)]
    return out


def test_a_stage_boundary_drains_the_overlap(tiny_model, tmp_path, e2e):
    steps = 4
    path = spec(tmp_path, tiny_model, steps=steps, stages=True)
    path.write_text(path.read_text().replace("keep_checkpoints = 2", "keep_checkpoints = 20"))  # step 3's is read
    run = e2e.run_here(path, tmp_path / "runs")
    rollouts, trained = versions(run)
    within_bound(rollouts, trained)
    rl = range(FIRST_RL, FIRST_RL + steps)
    # the sft steps' two updates, then the train stage afresh: its first step on-policy
    assert [(s, v, sv) for s, v, sv, _ in trained] == [(1, 0, None), (2, 1, None)] + [
        (t, t - 2, max(2, t - 3)) for t in rl]
    assert sorted(set(rollouts)) == [(FIRST_RL, 2)] + [(t, t - 3) for t in rl[1:]]
    con = open_store(run)
    sessions = con.execute("SELECT stage, step, weights, count(*), count(DISTINCT session_id) FROM sessions "
                           "WHERE status = 'ok' GROUP BY ALL ORDER BY step, weights").fetchall()
    last = FIRST_RL + steps
    assert sessions == [("before", 3, "trained", 2, 2)] + [("rl", t, None, 2, 2) for t in rl] + [
        ("after", last, "initial", 4, 4), ("after", last, "trained", 4, 4)]
    # the first train step was sampled by the weights the stages left (step 3's checkpoint),
    # not by the served copy's initial ones: the sampler's recorded log-probs are theirs
    first = con.execute("SELECT prompt_ids, completion_ids, logprobs FROM rollouts WHERE step = ? ORDER BY session_id",
                        [FIRST_RL]).fetchall()
    recorded = [x for *_, lp in first for x in lp]
    by_stages = sampler_logprobs(run / "checkpoints" / "a" / "step-3", [(p, c) for p, c, _ in first])
    initial = sampler_logprobs(tiny_model, [(p, c) for p, c, _ in first])
    assert recorded == pytest.approx(by_stages, abs=1e-4)
    assert recorded != pytest.approx(initial, abs=1e-4)


def test_kill_9_then_resume_with_stages_trains_every_step_once_within_the_bound(tiny_model, tmp_path, e2e):
    out = tmp_path / "runs"
    path = spec(tmp_path, tiny_model, steps=KILL_STEPS, stages=True)
    e2e.kill_run_when(e2e.cmd("run", str(path), "--out", str(out), "--quiet"), out,
                      lambda o: s if (s := e2e.latest_step(o)) is not None and s >= FIRST_RL + 1 else None, 300)
    run = e2e.only_run(out)
    killed_at = e2e.latest_step(out)
    last = FIRST_RL + KILL_STEPS
    assert killed_at is not None and killed_at < last
    e2e.resume_here(run)  # in this process: the killed one is gone
    rollouts, trained = versions(run)
    rl = list(range(FIRST_RL, last))
    assert [s for s, *_ in trained] == [1, 2] + rl  # every step exactly once (an evaluation trains nothing)
    assert [v for _, v, _, _ in trained] == list(range(2 + KILL_STEPS))
    within_bound(rollouts, trained)
    assert {s: v for s, v in rollouts}[FIRST_RL] == 2  # the train stage's first step on-policy
    con = open_store(run)
    assert con.execute("SELECT stage, weights, count(*), count(DISTINCT session_id) FROM sessions WHERE status = 'ok' "
                       "AND stage <> 'rl' GROUP BY ALL ORDER BY ALL").fetchall() == [
        ("after", "initial", 4, 4), ("after", "trained", 4, 4), ("before", "trained", 2, 2)]
    assert con.execute("SELECT count(*), count(DISTINCT session_id) FROM sessions WHERE status = 'ok' AND stage = 'rl'"
                       ).fetchone() == (2 * KILL_STEPS, 2 * KILL_STEPS)
    state = json.loads((run / "checkpoints" / "a" / f"step-{last}" / "trainer_state.json").read_text())
    assert state["version"] == 2 + KILL_STEPS


def test_what_cannot_overlap_is_refused_at_the_spec_line(tiny_model, tmp_path, capsys, monkeypatch):
    from askspec.cli import main

    monkeypatch.delenv("ASKSPEC_DEBUG", raising=False)  # as a user's shell: no traceback shown
    path = spec(tmp_path, tiny_model)
    path.write_text(path.read_text() + "buffer seen { capacity = 4; fields = {x: number} }\n")
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(tmp_path / "runs")]) != 0  # in this process: a refusal loads no model
    err = capsys.readouterr().err
    assert "'max_staleness = 1' (asynchronous rollouts) cannot run with a buffer" in err, err
    assert "t.ask:7:" in err and "Traceback" not in err and "internal error" not in err
