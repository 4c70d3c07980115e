"""A train block's settings are typed and checked at compile time (the diagnostics name the
closest valid key and point at the value), and `current(role)` models."""

from __future__ import annotations

from askspec.lang.compiler import compile_source
from askspec.diagnostics import format_diagnostic
from askspec.lang.training import ALGORITHM_ARGS, HYPERPARAMETERS

HEAD = '''
model m = hf("smollm2-135m-instruct") { temperature = 1.0 }
role q { model = m; trained; memory = none; prompt = "Ask."; reply = boxed }
game g sample 4 {
    a = ask q
    reward q = 1.0
}
'''


def diagnostics(body: str, head: str = HEAD) -> list[tuple[str, str, str, str]]:
    """(code, message, the source text under the caret, hint) of each error."""
    src = head + body
    res = compile_source("t.ask", src)
    lines = src.splitlines()
    out = []
    for d in res.sink.sorted():
        if not d.is_error:
            continue
        line = lines[d.span.line - 1]
        out.append((d.code, d.message, line[d.span.col - 1:d.span.end_col - 1], d.hint or ""))
    return out


def test_valid_settings_compile_with_their_values():
    res = compile_source("t.ask", HEAD + "train q with cispo(clip_low = 0.75, clip_high = 3.0) "
                                         "{ group = 4; lr = 0.000001; steps = 200; decay = cosine; kl = 0.01 }")
    assert res.ok, [format_diagnostic(d, res.sources) for d in res.sink.sorted()]
    t = res.ir.training[0]
    assert t.written() == {"clip_low": 0.75, "clip_high": 3.0, "group": 4, "lr": 1e-6, "steps": 200,
                           "decay": "cosine", "kl": 0.01}
    assert t.given == sorted(t.written())


def test_unknown_key_names_the_closest_valid_key():
    [(code, msg, under, hint)] = diagnostics("train q with grpo { learning_rate = 0.1 }")
    assert (code, under, hint) == ("E105", "learning_rate", "did you mean 'lr'?")
    [(code, msg, under, hint)] = diagnostics("train q with grpo { stesp = 3 }")
    assert (code, under, hint) == ("E105", "stesp", "did you mean 'steps'?")
    [(code, msg, under, hint)] = diagnostics("train q with cispo(clip_hgih = 3.0)")
    assert (code, hint) == ("E105", "did you mean 'clip_high'?") and "clip_hgih" in msg
    [(code, msg, under, hint)] = diagnostics("train q with grpo { clip_high = 0.3 }")
    assert code == "E105" and "argument of the algorithm: grpo(clip_high = ...)" in hint


def test_wrong_type_is_a_diagnostic_at_the_value():
    assert diagnostics('train q with grpo { lr = "fast" }') == [
        ("E201", "training setting 'lr' must be a number, found string", '"fast"', "")]
    [(code, msg, under, _)] = diagnostics("train q with grpo { steps = 2.5 }")
    assert (code, under) == ("E201", "2.5") and "whole number" in msg
    [(code, msg, under, hint)] = diagnostics("train q with grpo { decay = cosin }")
    assert (code, under, hint) == ("E107", "cosin", "did you mean 'cosine'?")
    [(code, msg, under, _)] = diagnostics("train q with cispo(clip_low = 2)")
    assert (code, under) == ("E107", "2") and "≤ 1" in msg
    [(code, msg, under, _)] = diagnostics("train q with grpo { lr = 0 }")
    assert (code, under) == ("E107", "0") and "> 0" in msg


def test_an_option_the_trainer_cannot_run_is_a_diagnostic_not_a_substitution():
    [(code, msg, under, hint)] = diagnostics("train q with ppo(estimator = gae)")
    assert (code, under) == ("E107", "gae") and "grpo" in msg  # no value model: GAE is refused, not replaced
    [(code, msg, under, hint)] = diagnostics("train q with dapo")
    assert code == "E405" and "unknown training algorithm 'dapo'" in msg


def test_current_role_weights_under_own_decoding():
    body = '''
model greedy = current(q) { temperature = 0.0 }
role key { model = greedy; memory = none; reply = boxed }
game h { k = ask key: "x" }
train q with grpo
'''
    res = compile_source("t.ask", HEAD + body)
    assert res.ok, [format_diagnostic(d, res.sources) for d in res.sink.sorted()]
    greedy = res.ir.model("greedy")
    assert greedy.weights_of == "q" and greedy.backend == "hf" and greedy.weights == "smollm2-135m-instruct"
    assert greedy.sampling["temperature"] == 0.0
    errs = diagnostics("model k2 = current(key)\nrole key { model = m; memory = none }\ngame h { k = ask key: \"x\" }")
    assert [(c, u) for c, _, u, _ in errs] == [("E405", "key")]
    errs = diagnostics("model k2 = current(nobody)")
    assert [(c, u) for c, _, u, _ in errs] == [("E102", "nobody")]
    errs = diagnostics("model k2 = current(q, 1)")
    assert [c for c, *_ in errs] == ["E109"]


def test_every_training_setting_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text()
    section = doc.split("### train")[1].split("### schedule")[0]
    for name in list(HYPERPARAMETERS) + [k for args in ALGORITHM_ARGS.values() for k in args]:
        assert f"`{name}`" in section, name
    assert "current(" in doc
