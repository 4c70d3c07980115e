"""docs/papers.md against the specs: every constant of an "as the paper" row in the table
below is written in that row (as the paper prints it) and is the value the compiled spec
holds (its IR: a parameter, a model's sampling, a lowered train block, a stage or buffer
setting). A row whose status says "as the paper" while the spec holds another value fails
here, and so does a row the table names that the doc dropped or re-labelled."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from askspec.ir import model as ir
from askspec.ir.render import expr_text
from askspec.lang.compiler import compile_file

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"Ask-E": "ask_e", "AskBench": "askbench", "Reasoning Arena": "reasoning_arena", "PasoDoble": "pasodoble",
        "SOAR": "soar"}

# (section, the row's item, profile (None: the spec's default), where in the IR, value, text the row shows)
# where: param:NAME | model:NAME.FIELD (sampling) | train:ROLE.FIELD (lowered) | stage:NAME.OPTION | buffer:NAME.OPTION
#        | role:NAME.FIELD | gate:ROLE (the train block's update_when, as `askspec compile --format text` prints it)
#        | assign:GAME.VAR (the expression a game's assignment to VAR holds, as printed) | tournament:NAME.FIELD
#        | schedule:kind
CONSTANTS: list[tuple[str, str, str | None, str, Any, str]] = [
    ("Ask-E", "probing rounds k", "benchmark", "param:probes", 4, "4 benchmark"),
    ("Ask-E", "probing rounds k", "training", "param:probes", 3, "3 training"),
    ("Ask-E", "repeats per pair", "benchmark", "param:repeats", 10, "10 benchmark"),
    ("Ask-E", "repeats per pair", "training", "param:repeats", 16, "G = 16"),
    ("Ask-E", "boundary temperature", None, "model:boundary_small.temperature", 0.7, "0.7"),
    ("Ask-E", "questioner budget", "benchmark", "model:policy.max_tokens", 6000, "6,000 probing"),
    ("Ask-E", "questioner budget", "benchmark", "param:final_tokens", 10000, "10,000 final"),
    ("Ask-E", "questioner budget", "training", "model:policy.max_tokens", 4000, "training 4,000"),
    ("Ask-E", "questioner budget", "training", "param:final_tokens", 4000, "training 4,000"),
    ("Ask-E", "questioner sampling, benchmark", "benchmark", "model:policy.top_p", 0.95, "top_p 0.95"),
    ("Ask-E", "questioner sampling, benchmark", "benchmark", "model:policy.top_k", 20, "top_k 20"),
    ("Ask-E", "questioner sampling, benchmark", "benchmark", "model:policy.presence_penalty", 1.5, "presence 1.5"),
    ("Ask-E", "questioner sampling, benchmark", "benchmark", "model:policy.min_p", 0.0, "min_p 0"),
    ("Ask-E", "questioner sampling, benchmark", "benchmark", "model:policy.repetition_penalty", 1.0, "repetition 1.0"),
    ("Ask-E", "diversity bonus", None, "param:alpha", 1.0, "α = 1"),
    ("Ask-E", "downstream pass@8 / avg@8 (App. G, Table 1)", "training", "stage:downstream_eval.samples", 8,
     "8 samples per problem"),
    ("Ask-E", "downstream pass@8 / avg@8 (App. G, Table 1)", "training", "stage:downstream_eval.k", [8], "k = [8]"),
    ("Ask-E", "downstream pass@8 / avg@8 (App. G, Table 1)", "training", "model:downstream_model.max_tokens", 32000,
     "32,000 tokens"),
    ("Ask-E", "questioner sampling, training", "training", "model:policy.temperature", 1.0, "T 1.0"),
    ("Ask-E", "answer key, training", "training", "model:key.temperature", 0.0, "T 0"),
    ("Ask-E", "forwarded question", None, "param:question_words", 200, "200 words"),
    ("Ask-E", "boundary summary", None, "param:summary_chars", 2000, "2,000 chars"),
    ("Ask-E", "format penalty", None, "param:format_penalty", 0.05, "−0.05"),
    # §5.1: every turn without the required tags, all three of App. B's sections, counts
    ("Ask-E", "format penalty", None, "assign:calibrate.untagged",
     "count((questioner.turns where not ((parsed and (len(reasoning) > 0)) and (len(draft) > 0))))",
     "`#Reasoning#`, `#Draft#`, `#Question#`"),
    ("Ask-E", "algorithm", "training", "train:questioner.clip_low", 0.75, "ε 0.75"),
    ("Ask-E", "algorithm", "training", "train:questioner.clip_high", 3.0, "/ 3.0"),
    ("Ask-E", "algorithm", "training", "train:questioner.aggregation", "token", "token-level"),
    ("Ask-E", "algorithm", "training", "train:questioner.kl", 0.0, "KL 0"),
    ("Ask-E", "optimizer", "training", "train:questioner.lr", 1e-6, "lr 1e-6"),
    ("Ask-E", "optimizer", "training", "train:questioner.weight_decay", 0.01, "wd 0.01"),
    ("Ask-E", "optimizer", "training", "train:questioner.grad_clip", 1.0, "clip 1.0"),
    ("Ask-E", "optimizer", "training", "train:questioner.beta2", 0.999, "β (0.9, 0.999)"),
    ("Ask-E", "optimizer", "training", "train:questioner.warmup", 60, "60 warm-up"),
    ("Ask-E", "optimizer", "training", "train:questioner.decay", "constant", "no decay"),
    ("Ask-E", "steps, batch", "training", "train:questioner.steps", 200, "200 steps"),
    ("Ask-E", "steps, batch", "training", "train:questioner.batch", 256, "256 rollouts"),
    ("Ask-E", "asynchronous rollouts, sequence caps", None, "param:staleness", 1, "`staleness` 1"),
    ("Ask-E", "asynchronous rollouts, sequence caps", "training", "train:questioner.max_staleness", 1,
     "at most one trainer update"),
    ("AskBench", "turn budget", "standard", "param:turns", 3, "3 turns"),
    ("AskBench", "Hard protocol", "hard", "param:turns", 2, "2 turns"),
    ("AskBench", "turn rewards", None, "param:premature_reward", -2.0, "−2.0"),
    ("AskBench", "turn rewards", None, "param:no_item_reward", -0.8, "−0.8"),
    ("AskBench", "turn rewards", None, "param:some_items_reward", 0.8, "+0.8"),
    ("AskBench", "turn rewards", None, "param:all_items_reward", 1.0, "+1.0"),
    ("AskBench", "terminal rewards", None, "param:correct_reward", 1.0, "+1 /"),
    ("AskBench", "terminal rewards", None, "param:wrong_reward", -1.0, "−1 /"),
    ("AskBench", "terminal rewards", None, "param:still_asking_reward", -2.0, "−2 still asking"),
    ("AskBench", "training", None, "train:assistant.group", 8, "n = 8"),
    ("AskBench", "training", None, "train:assistant.lr", 1e-6, "lr 1e-6"),
    ("AskBench", "training", None, "train:assistant.batch", 512, "training batch size 64"),
    ("AskBench", "training", None, "train:assistant.steps", 500, "500 steps"),
    ("AskBench", "trained models", "ours_i", "param:dimension", "ask_mind", "OursI"),
    ("AskBench", "trained models", "ours_o", "param:dimension", "ask_overconfidence", "OursO"),
    ("AskBench", "evaluation", None, "stage:heldout.samples", 1, "pass@1"),
    ("AskBench", "evaluation", None, "stage:heldout.weights", ["trained", "initial"], "trained and the initial"),
    ("AskBench", "evaluation", None, "param:eval_dimensions", ["ask_mind", "ask_overconfidence"], "both dimensions"),
    ("AskBench", "FATA baseline", "fata", "param:baseline", "fata", "App. B.2"),
    ("AskBench", "FATA baseline", "fata", "param:turns", 3, "3-turn"),
    ("AskBench", "FATA baseline", "fata", "param:eval_dimensions", ["ask_mind"], "AskMind only"),
    ("AskBench", "Self-Alert baseline", "self_alert", "param:baseline", "self_alert", "App. B.3"),
    ("AskBench", "Self-Alert baseline", "self_alert", "param:turns", 2, "turns = 2"),
    ("AskBench", "Self-Alert baseline", "self_alert", "param:protocol", "hard", "Hard protocol"),
    ("AskBench", "Self-Alert baseline", "self_alert", "param:eval_dimensions", ["ask_overconfidence"],
     "AskOverconfidence only"),
    ("AskBench", "max prompt length", None, "role:assistant.max_prompt_tokens", 2048, "2,048"),
    ("Reasoning Arena", "group size N", None, "param:group_size", 8, "8 (App. B)"),
    ("Reasoning Arena", "CISPO", None, "train:policy.clip_low", 1.0, "ε_lo = 1.0"),
    ("Reasoning Arena", "CISPO", None, "train:policy.clip_high", 2.0, "ε_hi = 2.0"),
    ("Reasoning Arena", "optimisation", "paper", "train:policy.lr", 4e-7, "lr 4e-7"),
    ("Reasoning Arena", "optimisation", "paper", "train:policy.decay", "constant", "constant lr"),
    ("Reasoning Arena", "optimisation", "paper", "train:policy.steps", 1500, "1,500 steps"),
    ("Reasoning Arena", "optimisation", "paper", "train:policy.warmup", 50, "50 warm-up"),
    ("Reasoning Arena", "optimisation", "paper", "train:policy.batch", 480, "480 rollouts"),
    ("Reasoning Arena", "training advantage", None, "train:policy.std", "population", "population σ"),
    ("Reasoning Arena", "policy sequence length", "paper", "model:policy_model.max_tokens", 81920, "81,920"),
    ("Reasoning Arena", "evaluation", "paper", "stage:heldout.samples", 16, "samples = 16"),
    ("Reasoning Arena", "REASONING ARENA-Live", None, "tournament:arena.pairing", "live", "live(best, worst, median)"),
    ("Reasoning Arena", "REASONING ARENA-Live", None, "tournament:arena.live_opponents", ["best", "worst", "median"],
     "best, worst, median"),
    ("PasoDoble", "I, J", None, "param:proposals", 6, "6, 6"),
    ("PasoDoble", "I, J", None, "param:solutions", 6, "6, 6"),
    ("PasoDoble", r"τ_low, τ_sim, τ_div, w, \|H\|", None, "param:tau_low", 0.2, "0.2, 0.3, 0.3, 0.2, 100"),
    ("PasoDoble", r"τ_low, τ_sim, τ_div, w, \|H\|", None, "param:tau_sim", 0.3, "0.2, 0.3, 0.3, 0.2, 100"),
    ("PasoDoble", r"τ_low, τ_sim, τ_div, w, \|H\|", None, "param:tau_div", 0.3, "0.2, 0.3, 0.3, 0.2, 100"),
    ("PasoDoble", r"τ_low, τ_sim, τ_div, w, \|H\|", None, "param:w_div", 0.2, "0.2, 0.3, 0.3, 0.2, 100"),
    ("PasoDoble", r"τ_low, τ_sim, τ_div, w, \|H\|", None, "param:history", 100, "0.2, 0.3, 0.3, 0.2, 100"),
    ("PasoDoble", "sampling (training)", None, "model:base.temperature", 0.6, "temperature 0.6"),
    ("PasoDoble", "sampling (training)", None, "model:base.top_p", 1.0, "top_p 1.0"),
    ("PasoDoble", "sampling (training)", None, "model:base.max_tokens", 6144, "completion 6,144"),
    ("PasoDoble", "max prompt length", None, "role:proposer.max_prompt_tokens", 1280, "proposer 1,280"),
    ("PasoDoble", "max prompt length", None, "role:solver.max_prompt_tokens", 512, "solver 512"),
    ("PasoDoble", "lr, KL", None, "train:proposer.lr", 1e-6, "1e-6"),
    ("PasoDoble", "lr, KL", None, "train:solver.lr", 1e-6, "1e-6"),
    ("PasoDoble", "lr, KL", None, "train:proposer.kl", 0.0, "0.0"),
    ("PasoDoble", "lr, KL", None, "train:solver.kl", 0.0, "0.0"),
    ("PasoDoble", "offline loop", "offline", "param:proposer_steps", 10, "T_P = 10"),
    ("PasoDoble", "offline loop", "offline", "param:solver_steps", 5, "T_S = 5"),
    ("PasoDoble", "offline loop", "offline", "param:iterations", 60, "60 iterations"),
    ("PasoDoble", "online steps", "online", "param:online_steps", 600, "600 (Table 5)"),
    ("PasoDoble", "online skip-update rule", "online", "gate:proposer", "(sum(pushed) > 0)", "sum(pushed) > 0"),
    ("PasoDoble", "online skip-update rule", "online", "gate:solver", "(sum(pushed) > 0)", "sum(pushed) > 0"),
    ("PasoDoble", "offline skip-update rule", "offline", "gate:proposer", "(sum(pushed) > 0)", "sum(pushed) > 0"),
    ("PasoDoble", "offline skip-update rule", "offline", "gate:solver", None, "the solver has no gate"),
    ("PasoDoble", "offline replay", "offline", "train:solver.batch", 12, "replay_questions = 12"),
    ("PasoDoble", "evaluation protocol", None, "stage:heldout.samples", 6, "6 samples"),
    ("PasoDoble", "evaluation protocol", None, "stage:heldout.k", [1], "pass@1"),
    ("PasoDoble", "evaluation protocol", None, "model:eval_model.temperature", 0.6, "temperature 0.6"),
    ("PasoDoble", "evaluation protocol", None, "model:eval_model.top_p", 0.95, "top_p 0.95"),
    ("PasoDoble", "buffer eviction ablation", None, "buffer:questions.patience", 3, "c = 3"),
    ("PasoDoble", "baselines", None, "param:shots", 4, "4-shot"),
    ("PasoDoble", "baselines", None, "stage:base_4shot.weights", ["initial"], "weights = [initial]"),
    ("PasoDoble", "baselines", None, "stage:coldstart.weights", ["trained"], "weights = [trained]"),
    ("PasoDoble", "baselines", None, "stage:coldstart.samples", 6, "6 samples"),
    ("PasoDoble", "baselines", None, "stage:base_4shot.k", [1], "pass@1"),
    # §5.4: each ablation is the online training with one change
    *(("PasoDoble", "ablations (§5.4)", p, "schedule:kind", "online", "the online training")
      for p in ("no_k", "frozen_proposer", "random_reward", "no_div")),
    *(("PasoDoble", "ablations (§5.4)", p, "gate:solver", "(sum(pushed) > 0)", "profile `online`'s schedule and gates")
      for p in ("no_k", "frozen_proposer", "random_reward", "no_div")),
    ("PasoDoble", "ablations (§5.4)", "no_k", "param:knowledge", False, "`knowledge = false`"),
    ("PasoDoble", "ablations (§5.4)", "frozen_proposer", "gate:proposer", "((sum(pushed) > 0) and false)",
     "`sum(pushed) > 0 and false`"),
    ("PasoDoble", "ablations (§5.4)", "random_reward", "param:solver_reward", "random", "`solver_reward = \"random\"`"),
    ("PasoDoble", "ablations (§5.4)", "no_div", "param:w_div", 0.0, "`w_div = 0`"),
    ("PasoDoble", "ablations (§5.4)", "no_div", "param:tau_div", 0.0, "`tau_div = 0`"),
    ("PasoDoble", "ablations (§5.4)", "online", "param:knowledge", True, "w/o K"),
    ("PasoDoble", "ablations (§5.4)", "online", "param:solver_reward", "verifier", "random rewards"),
    ("SOAR", "g, n, r, inner steps", None, "param:datasets", 4, "4, 64, 4, 10"),
    ("SOAR", "g, n, r, inner steps", None, "param:dataset_size", 64, "4, 64, 4, 10"),
    ("SOAR", "g, n, r, inner steps", None, "param:copies", 4, "4, 64, 4, 10"),
    ("SOAR", "g, n, r, inner steps", None, "param:inner_steps", 10, "4, 64, 4, 10"),
    ("SOAR", "promotion", None, "param:promotion_window", 3, "window 3"),
    ("SOAR", "promotion", None, "param:promotion_threshold", 0.01, "τ = 0.01"),
    ("SOAR", "promotion", None, "param:extra_inner_steps", 5, "+5 inner steps"),
    ("SOAR", "outer steps", None, "param:outer_steps", 200, "at most 200"),
    ("SOAR", "max generated tokens", None, "model:teacher_model.max_tokens", 512, "512 teacher"),
    ("SOAR", "max generated tokens", None, "model:student_model.max_tokens", 1024, "1,024 student"),
    ("SOAR", "Intrinsic-T reward", "intrinsic_t", "param:student_samples", 32, "over 32 samples"),
    ("SOAR", "RLOO, batch, lr, KL, warm-up", None, "train:student.batch", 256, "batch = 256"),
    ("SOAR", "RLOO, batch, lr, KL, warm-up", None, "train:teacher.lr", 1e-5, "lr 1e-5"),
    ("SOAR", "RLOO, batch, lr, KL, warm-up", None, "train:student.lr", 1e-5, "lr 1e-5"),
    ("SOAR", "RLOO, batch, lr, KL, warm-up", None, "train:teacher.kl", 0.001, "KL 0.001"),
    ("SOAR", "RLOO, batch, lr, KL, warm-up", None, "train:student.kl", 0.001, "KL 0.001"),
    ("SOAR", "RLOO, batch, lr, KL, warm-up", None, "train:teacher.warmup", 20, "warm-up 20 teacher"),
    ("SOAR", "RLOO, batch, lr, KL, warm-up", None, "train:student.warmup", 0, "0 student inner loop"),
    ("SOAR", "RLOO, batch, lr, KL, warm-up", None, "train:student.group", 32, "group 32"),
    ("SOAR", "RLOO, batch, lr, KL, warm-up", None, "train:student.decay", "cosine", "cosine decay"),
    ("SOAR", "temperatures", None, "model:teacher_model.temperature", 1.0, "1.0 teacher and student"),
    ("SOAR", "temperatures", None, "model:student_model.temperature", 1.0, "1.0 teacher and student"),
    ("SOAR", "Promoted Student (PS)", None, "stage:ps.samples", 32, "32 samples per problem"),
    ("SOAR", "Promoted Student (PS)", None, "stage:ps.k", [1, 4, 8, 16, 32], "k ∈ {1, 4, 8, 16, 32}"),
    ("SOAR", "Hard-Only", None, "train:student.group", 32, "group 32"),
    ("SOAR", "teacher evaluation (Grounded-T, Intrinsic-T)", None, "param:teacher_questions", 128, "128 questions"),
    ("SOAR", "teacher evaluation (Grounded-T, Intrinsic-T)", "intrinsic_t", "param:teacher_questions", 128,
     "128 questions"),
    ("SOAR", "Promotion Questions (PQ)", None, "stage:pq_student.steps", 1500, "1,500 steps"),
    ("SOAR", "Promotion Questions (PQ)", None, "stage:pq_student.warmup", 20, "warm-up 20"),
    # App. B.6, after the run: the whole budget, a centred 25-step window, 15 %, test pass@k over 200 steps
    *(("SOAR", "student checkpoint selection", p, f"stage:{stage}.keep",
       {"rule": "plateau", "of": "reward", "window": 25, "fraction": 0.15, "select": "posthoc", "average": 200,
        "every": 50}, "select = posthoc") for p in ("grounded", "intrinsic_t")
      for stage in ("pq_student", "hard_only", "teacher_student")),
    ("SOAR", "student checkpoint selection", None, "param:plateau_window", 25, "smoothed over 25 steps (centred)"),
    ("SOAR", "student checkpoint selection", None, "param:plateau_fraction", 0.15, "15 %"),
    ("SOAR", "student checkpoint selection", None, "param:plateau_average", 200, "200 steps after it"),
    ("SOAR", "student checkpoint selection", None, "param:pq_steps", 1500, "1,500 steps"),
]

# Rows whose "as the paper" (or "ours") is behaviour, not a constant: (section, item, the status the
# row starts with, the test file the row cites, a test of that file that pins the behaviour)
BEHAVIOUR: list[tuple[str, str, str, str, str]] = [
    ("SOAR", "promotion", "as the paper", "tests/train/test_nested_loop.py",
     "test_promotion_keeps_the_median_copy_of_the_best_dataset"),  # one running average, not reset (Alg. 1)
    ("SOAR", "student checkpoint selection", "as the paper", "tests/train/test_stages.py",
     "test_the_posthoc_selection_is_app_b6_rule_on_a_noisy_rising_curve"),
    ("Ask-E", "format penalty", "as the paper", "tests/engine/test_engine_ask_e_replay.py", "test_rewards"),
    ("Reasoning Arena", "REASONING ARENA-Live", "as the paper", "tests/engine/test_routing_alone.py",
     "test_a_live_tournament_takes_the_traces_in_finish_order"),
    ("PasoDoble", "ablations (§5.4)", "as the paper", "tests/specs/test_pasodoble_ablations.py",
     "test_each_ablation_checks_clean_and_shows_the_online_plan"),
    ("AskBench", "turn and terminal rewards combined", "ours", "runtime/train/batch.py", ""),
]


@cache
def rows() -> dict[tuple[str, str], list[str]]:
    """(section, item) -> the row's cells (item, paper, spec, status); `\\|` is a literal bar."""
    out: dict[tuple[str, str], list[str]] = {}
    section = ""
    for line in (ROOT / "docs" / "papers.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("| ") and not line.startswith("| item |"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            out[(section, cells[0])] = cells
    return out


@cache
def compiled(spec: str, profile: str | None) -> ir.Experiment:
    res = compile_file(str(ROOT / "specs" / f"{spec}.ask"), profile=profile)
    assert res.ir is not None, [d.message for d in res.sink.sorted()]
    return res.ir


def ir_value(exp: ir.Experiment, where: str) -> Any:
    kind, _, path = where.partition(":")
    name, _, field = path.partition(".")
    if kind == "param":
        return exp.param_values()[name]
    if kind == "model":
        return exp.model(name).sampling[field]
    if kind == "train":
        (t,) = [t for t in exp.training if t.role == name]
        assert t.config is not None
        return getattr(t.config, field)
    if kind == "stage":
        (s,) = [s for s in exp.stages if s.name == name]
        return s.options[field]
    if kind == "buffer":
        (b,) = [b for b in exp.buffers if b.name == name]
        return b.options[field]
    if kind == "role":
        return getattr(exp.role(name), field)
    if kind == "gate":
        (t,) = [t for t in exp.training if t.role == name]
        return expr_text(t.update_when) if t.update_when is not None else None
    if kind == "assign":
        from askspec.ir.walk import all_steps

        (game,) = [g for g in exp.games if g.name == name]
        return next(expr_text(s.value) for s in all_steps(game.body) if s.kind == "assign" and s.name == field)
    if kind == "tournament":
        (t,) = [t for t in exp.tournaments if t.name == name]
        return getattr(t, field)
    if kind == "schedule":
        assert exp.schedule is not None
        return getattr(exp.schedule, name)
    raise AssertionError(f"unknown place {where!r}")


@pytest.mark.parametrize("section, item, profile, where, value, shown", CONSTANTS,
                         ids=[f"{s}/{i}/{w}@{p or 'default'}" for s, i, p, w, _, _ in CONSTANTS])
def test_an_as_the_paper_constant_is_in_its_row_and_in_the_spec(section, item, profile, where, value, shown):
    row = rows().get((section, item))
    assert row is not None, f"docs/papers.md has no row '{item}' under '{section}'"
    assert row[3].startswith("as the paper"), f"'{item}': {row[3]}"
    assert shown in " | ".join(row[1:3]), f"'{item}' does not show {shown!r}"
    assert ir_value(compiled(SPEC[section], profile), where) == value, (section, item, where)


def test_the_table_parses_every_section():
    assert {s for s, _ in rows()} >= set(SPEC)


@pytest.mark.parametrize("section, item, status, cited, test", BEHAVIOUR, ids=[f"{s}/{i}" for s, i, *_ in BEHAVIOUR])
def test_a_behaviour_row_cites_what_pins_it(section, item, status, cited, test):
    row = rows().get((section, item))
    assert row is not None, f"docs/papers.md has no row '{item}' under '{section}'"
    assert row[3].startswith(status), f"'{item}': {row[3]}"
    assert cited in " | ".join(row[2:]), f"'{item}' does not cite {cited}"
    text = (ROOT / cited).read_text(encoding="utf-8")
    assert not test or f"def {test}(" in text, f"{cited} has no {test}"


def test_askbench_names_its_reward_sum_where_it_trains():
    """§4.2 gives turn and terminal rewards, not their combination: the spec's comment and the
    trainer's batch both name the sum as askspec's own."""
    spec = (ROOT / "specs" / "askbench.ask").read_text(encoding="utf-8")
    assert "Ours: a dialogue's reward is the sum of its turn rewards" in spec
    batch = (ROOT / "runtime" / "train" / "batch.py").read_text(encoding="utf-8")
    assert "its spec names the sum as" in batch
