"""specs/ask_e.ask against the Ask-E paper: each configuration's constants, a boundary
set whose models really differ, the App. B prompts, and the SymPy boundary model."""

from __future__ import annotations

from pathlib import Path

import pytest

from askspec.ir import model as ir
from askspec.ir.walk import all_steps
from askspec.lang.compiler import compile_file
from askspec.runtime.backends.solvers import solve_text, sympy_math

SPEC = Path(__file__).resolve().parents[2] / "specs" / "ask_e.ask"


def ir_of(profile: str | None = None):
    res = compile_file(str(SPEC), None, profile)
    assert res.ok
    return res.ir


def test_benchmark_is_the_default_configuration_with_the_papers_constants():
    exp = ir_of()
    assert exp.options["profile"] == "benchmark"
    params = exp.param_values()
    assert (params["probes"], params["repeats"], params["question_words"], params["summary_chars"]) == (4, 10, 200, 2000)
    assert exp.model("policy").sampling == {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                                            "presence_penalty": 1.5, "repetition_penalty": 1.0, "max_tokens": 6000}
    key = exp.model("key")
    assert key.weights_of is None and key.sampling["temperature"] == 0.7  # a separate instance (§3, App. F)


@pytest.mark.parametrize("profile, final", [("benchmark", 10000), ("training", 4000)])
def test_the_final_question_has_its_own_budget(profile, final):
    """App. F: the questioner's final reply has 10,000 tokens against the probes' 6,000;
    App. E caps every training turn at 4,000."""
    game = next(g for g in ir_of(profile).games if g.name == "calibrate")
    asks = [s for s in all_steps(game.body) if isinstance(s, ir.AskStep) and s.roles == ["questioner"]]
    assert [s.sampling for s in asks] == [{}, {"max_tokens": final}]  # the probe, then the final question


def test_training_configuration_has_the_papers_constants():
    exp = ir_of("training")
    params = exp.param_values()
    assert (params["probes"], params["repeats"]) == (3, 16)
    assert exp.model("policy").sampling["max_tokens"] == 4000
    assert exp.model("boundary_small").sampling["max_tokens"] == 3000
    key = exp.model("key")
    assert key.weights_of == "questioner" and key.sampling["temperature"] == 0.0  # self-judge (App. E)
    (train,) = exp.training
    assert train.algorithm == "cispo"
    h = train.written()
    assert (h["clip_low"], h["clip_high"]) == (0.75, 3.0)
    assert (h["group"], h["lr"], h["steps"], h["batch"], h["kl"], h["warmup"], h["weight_decay"], h["grad_clip"]) == (
        16, 0.000001, 200, 256, 0.0, 60, 0.01, 1.0)
    assert ir_of("benchmark").training[0].written()["group"] == 10  # group follows repeats


def test_boundary_models_really_differ():
    """Not copies of one model that differ only in top_p / top_k (sampling noise)."""
    exp = ir_of()
    models = [exp.model(name) for name in exp.param_values()["boundary_set"]]

    def what(m):
        sampling = {k: v for k, v in m.sampling.items() if k not in ("top_p", "top_k", "temperature", "seed")}
        return m.backend, m.weights, tuple(sorted(sampling.items()))

    assert len({what(m) for m in models}) == len(models)
    assert {m.backend for m in models} == {"hf", "python"}


def test_prompts_are_app_b_word_for_word():
    exp = ir_of()
    text = {name.split("/")[-1]: t.source for name, t in exp.templates.items()}
    system = text["questioner_system.j2"]
    for passage in ("Each round, consider:\n- What concepts or difficulty levels seem to separate the two models",
                    "If the answer is ambiguous, has multiple valid values, or depends on unstated assumptions, "
                    "draft another and try again.",
                    "do not include solutions, reasoning, hints, or any other text after the question."):
        assert passage in system
    assert "Answer the given question. Think step-by-step but keep your reasoning concise.\n" \
           "Output the final solution in \\boxed{}" in text["grade_system.j2"]
    assert text["grade_question.j2"].rstrip().endswith("{{ message }}\n\nOutput the final solution in \\boxed{}")
    assert "output the worked-out answer to your final question under #Solution#" in text["recover_malformed.j2"]


@pytest.mark.parametrize("question,answer", [
    ("Find the remainder when 2023^{2023} is divided by 100.", "67"),  # App. D, turn 1
    ("What is 17 * 23 + 4?", "395"),
    ("Compute $\\frac{3}{4} + \\frac{1}{6}$.", "\\frac{11}{12}"),
    ("Solve 3x + 5 = 20.", "5"),
    ("What is the gcd of 84 and 120?", "12"),
    ("What is $\\binom{10}{3}$?", "120"),
])
def test_sympy_boundary_solves_computations(question, answer):
    assert solve_text(question)[1] == answer
    reply = sympy_math([{"role": "user", "content": question + "\n\nWhen you are done, output #Summary# ..."}], None)
    assert reply.startswith("#Summary#") and reply.endswith(f"\\boxed{{{answer}}}")


@pytest.mark.parametrize("question", [
    # App. D's final question: a word problem, which a calculator cannot read
    "Find the number of sequences of length 6 formed by the letters A, B, C, and D such that the sequence does "
    "not contain the consecutive substring \"AB\".",
    "What is 9^9^9?",           # too large to compute: refused before evaluating
    "What is input()?",         # only plain math reaches SymPy's parser
])
def test_sympy_boundary_gives_no_answer_to_what_it_cannot_read(question):
    assert "\\boxed" not in sympy_math([{"role": "user", "content": question}], None)
