"""`--resume` refuses a run whose spec now trains differently because a training default
changed (the lowered settings are part of the experiment hash), and accepts it otherwise."""

from __future__ import annotations

import dataclasses

import pytest

from askspec.lang import training
from askspec.runtime.commands.options import RunOptions, UsageError
from askspec.runtime.commands.start import compile_spec

SPEC = """model m = hf("smollm2-135m-instruct")
role a { model = m; prompt = "guess a number"; trained }
game g for i in range(0, 8) {
    x = ask a
    reward a = 1.0
}
train a with grpo { group = 2; steps = 3 }
"""


def test_resume_refuses_when_a_default_the_spec_relies_on_changed(tmp_path, monkeypatch):
    spec = tmp_path / "s.ask"
    spec.write_text(SPEC, encoding="utf-8")
    opts = RunOptions(file=str(spec), resume=str(tmp_path / "run"))
    _, recorded = compile_spec(opts, None)
    manifest = {"experiment_hash": recorded}
    assert compile_spec(opts, manifest)[1] == recorded  # the same spec and defaults resume
    monkeypatch.setitem(training.HYPERPARAMETERS, "grad_clip",
                        dataclasses.replace(training.HYPERPARAMETERS["grad_clip"], default=0.5))
    with pytest.raises(UsageError, match=r"refusing to resume .*experiment hash .* differs"):
        compile_spec(opts, manifest)


@pytest.mark.parametrize(("field", "value"), [("max_tokens", 512), ("temperature", 0.7)])
def test_resume_refuses_when_a_sampling_default_changed(tmp_path, monkeypatch, field, value):
    """The sampling defaults a call uses where the spec sets none are in the IR (hashed):
    another default is another experiment, and the engine and the bounds read the IR's."""
    from askspec.ir import vocab
    from askspec.runtime.engine.calls import ModelCalls
    from askspec.runtime.engine.state import ModelBinding

    spec = tmp_path / "s.ask"
    spec.write_text(SPEC, encoding="utf-8")
    opts = RunOptions(file=str(spec), resume=str(tmp_path / "run"))
    res, recorded = compile_spec(opts, None)
    assert res.ir.sampling_defaults == vocab.SAMPLING_DEFAULTS
    manifest = {"experiment_hash": recorded}
    monkeypatch.setitem(vocab.SAMPLING_DEFAULTS, field, value)
    with pytest.raises(UsageError, match=r"refusing to resume .*experiment hash .* differs"):
        compile_spec(opts, manifest)
    # a call of the role reads the compiled default (the model and role set none)
    changed = compile_spec(RunOptions(file=str(spec)), None)[0].ir
    assert changed.sampling_defaults[field] == value

    binding = ModelBinding(name="m", backend=None, weights="m", sampling={})  # type: ignore[arg-type]  # never called
    fields, _ = ModelCalls(None, defaults=changed.sampling_defaults).sampling("a", changed.role("a"), binding)
    assert fields[field] == value
