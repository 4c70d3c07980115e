"""PasoDoble's §5.4 ablations as profiles of specs/pasodoble.ask (issue 34 item 3): each is
the online training with one change (Table 2: w/o K, w/ π_p frozen; Table 3: random
rewards; Table 4: w/o r_div), checked clean and planned by `askspec check`; the changes
themselves are pinned on the compiled IR, the rendered prompt, the update gate and a
replayed `propose` session (no model is loaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_file
from askspec.lang.sandbox import environment

SPEC = Path(__file__).resolve().parents[2] / "specs" / "pasodoble.ask"
ABLATIONS = ("no_k", "frozen_proposer", "random_reward", "no_div")


def compiled(profile: str | None = None, sets: dict[str, str] | None = None):
    res = compile_file(str(SPEC), sets or {}, profile)
    assert res.ok, [d.message for d in res.sink.items]
    assert [d.message for d in res.sink.items if d.code == "W501"] == []  # no parameter left unused
    return res.ir


@pytest.mark.parametrize("profile", ABLATIONS)
def test_each_ablation_checks_clean_and_shows_the_online_plan(profile):
    done = subprocess.run([sys.executable, "-m", "askspec.cli", "check", str(SPEC), "--profile", profile],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "ok: 1 spec checked" in out and "error" not in out and "warning" not in out
    # Tables 2-4 compare with the online training: 600 steps of both roles
    assert "train proposer: 600 steps" in out and "train solver: 600 steps" in out
    exp = compiled(profile)
    assert exp.schedule.kind == "online" and exp.schedule.options == {"steps": 600, "games": ["propose"]}


def test_each_ablation_changes_only_its_own_item():
    base = compiled("online").param_values()
    changed = {p: {k: v for k, v in compiled(p).param_values().items() if base.get(k) != v} for p in ABLATIONS}
    assert changed == {"no_k": {"knowledge": False}, "frozen_proposer": {}, "random_reward": {"solver_reward": "random"},
                       "no_div": {"w_div": 0.0, "tau_div": 0.0}}


def proposer_prompt(profile: str | None) -> str:
    exp = compiled(profile)
    role = exp.role("proposer")
    return environment().from_string(exp.templates[role.prompt].source).render(
        **exp.param_values(), passage={"text": "Primes have two divisors."})


def test_without_k_the_proposer_sees_no_passage():
    # the default prompt is Fig. 11's, word for word; w/o K drops the passage line
    assert proposer_prompt("online") == (
        "External knowledge: Primes have two divisors.\n\nNow, please create a challenging, well-structured, diverse, "
        "and unambiguous mathematical problem that has a verifiable numerical answer, using the provided external and "
        "internal knowledge as context.\n")
    text = proposer_prompt("no_k")
    assert "Primes" not in text and "External knowledge" not in text
    assert text.startswith("Now, please create") and "using your internal knowledge as context." in text


def test_a_frozen_proposer_never_passes_its_update_gate():
    from askspec.runtime.engine.metrics import gate_closed, gate_scope

    def closed(profile: str, role: str, pushed: int) -> bool:
        exp = compiled(profile)
        gate = next(t.update_when for t in exp.training if t.role == role)
        scope = gate_scope({"pushed": pushed}, {}, step=1, outcome=None, status="ok", game="propose", rewards={})
        return gate_closed(exp, gate, [scope]) is not None

    assert closed("frozen_proposer", "proposer", 3) and not closed("frozen_proposer", "solver", 3)
    assert not closed("online", "proposer", 3) and closed("online", "proposer", 0)


def replayed_rewards(tmp_path: Path, *args: str) -> tuple[list[tuple[str, float]], dict]:
    from askspec.runtime.store.views import connect

    script = {"sessions": [{
        "proposer": ["<problem>What is 2+3?</problem> <answer>\\boxed{5}</answer>",
                     "<problem>What is 7 times 6 minus 1?</problem> <answer>\\boxed{41}</answer>"],
        "solver": ["\\boxed{999}"] * 6 + ["no box", "no box"]}]}  # every answer wrong, the last two unboxed
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(script))
    done = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(SPEC), "--eval-only", "--replay", str(replay),
                           "--sessions", "1", "--set", "proposals=2", "--set", "solutions=4", "--out",
                           str(tmp_path / "runs"), "--quiet", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    con = connect(done.stdout.strip().splitlines()[-1]).con
    rewards = con.execute("SELECT role, value FROM rewards ORDER BY turn_index").fetchall()
    (vars_,) = con.execute("SELECT vars FROM sessions").fetchone()
    return rewards, json.loads(vars_) if isinstance(vars_, str) else vars_


@pytest.mark.parametrize("variant", ["random", "partial_random"])
def test_random_rewards_replace_the_verifier_and_set_p(tmp_path, variant):
    """§5.4.3: r_ij ~ Bernoulli(0.5) whatever the answer (Full.), or 0 without an answer box
    (Part.); p, the proposer's difficulty, is their mean."""
    rewards, v = replayed_rewards(tmp_path, "--profile", "random_reward", "--set", f"solver_reward={variant}")
    coins = [c % 2 for c in v["coins"]]
    assert len(v["coins"]) == len(set(v["coins"])) == 8 and all(0 <= c < 65536 for c in v["coins"])
    solver = [r for role, r in rewards if role == "solver"]
    expected = coins[:6] + (coins[6:] if variant == "random" else [0, 0])
    assert solver == expected
    proposer = [r for role, r in rewards if role == "proposer"]
    for k, r in enumerate(proposer):  # (1.1 - p) + w·r_div when p > τ_low (r_div = 1 for the first questions)
        p = sum(expected[4 * k:4 * k + 4]) / 4
        assert r == pytest.approx(1.1 - p + 0.2 if p > 0.2 else 0.0)


def test_the_verifier_is_the_default(tmp_path):
    rewards, v = replayed_rewards(tmp_path, "--profile", "online")
    assert v["coins"] == [] and all(r == 0.0 for _, r in rewards)  # every answer wrong: p = 0, no proposer reward
