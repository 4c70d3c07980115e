"""Every numeric training setting is bounded on both sides, the bound is checked when
the spec is compiled (E107 at the value), and docs/language.md states the same range
(issue #25, item 4: `lr = 1e308` passed the checker and turned every weight NaN)."""

from __future__ import annotations

from pathlib import Path

import pytest

from askspec.lang.compiler import compile_source
from askspec.lang.training import ALGORITHM_ARGS, HYPERPARAMETERS

HEAD = 'model m = hf("smollm2-135m-instruct")\nrole r { model = m; trained; prompt = "Answer." }\ngame g { x = ask r\n reward r = 1 }\n'


def codes(train: str) -> list[tuple[str, str]]:
    res = compile_source("t.ask", HEAD + train + "\n")
    return [(d.code, d.message) for d in res.sink.sorted()]


def test_every_number_setting_has_an_upper_bound():
    numbers = {**HYPERPARAMETERS, **{k: s for a in ALGORITHM_ARGS.values() for k, s in a.items()}}
    unbounded = [k for k, s in numbers.items() if s.kind in ("int", "number") and s.high is None]
    # min_reward is any reward; group, batch and steps are bounded by the plan check (E405 / W503)
    assert sorted(unbounded) == ["batch", "group", "min_reward", "steps"]


@pytest.mark.parametrize("setting, bad, good", [
    ("lr = {}", "1e308", "0.5"), ("lr = {}", "2", "1"), ("kl = {}", "11", "10"), ("beta1 = {}", "1.0", "0.99"),
    ("beta2 = {}", "1", "0.999"), ("weight_decay = {}", "5", "0.1"), ("grad_clip = {}", "1e9", "1000"),
    ("epochs = {}", "101", "100"), ("micro_batch = {}", "5000", "4096"), ("warmup = {}", "2000000", "10"),
    ("max_nonfinite_steps = {}", "0", "1"), ("keep_checkpoints = {}", "1001", "1000"),
    ("max_staleness = {}", "101", "1"), ("is_bound = {}; max_staleness = 1", "0.5", "2.0"),
])
def test_numeric_settings_are_range_checked(setting, bad, good):
    errs = codes(f"train r with grpo {{ {setting.format(bad)} }}")
    name = setting.split(" ")[0]
    assert [c for c, _ in errs] == ["E107"] and f"'{name}' must be" in errs[0][1], errs
    assert codes(f"train r with grpo {{ {setting.format(good)} }}") == []


def test_clip_arguments_and_min_lr_are_range_checked():
    assert [c for c, _ in codes("train r with cispo(clip_high = 50) { }")] == ["E107"]
    assert [c for c, _ in codes("train r with grpo(dual_clip = 1000) { }")] == ["E107"]
    assert [c for c, _ in codes("train r with grpo(clip = 11) { }")] == ["E107"]
    assert codes("train r with cispo(clip_high = 5) { }") == []
    errs = codes("train r with grpo { lr = 0.001; min_lr = 0.01 }")
    assert [c for c, _ in errs] == ["E107"] and "at most lr" in errs[0][1]
    assert codes("train r with grpo { lr = 0.001; min_lr = 0.0001 }") == []


def test_docs_state_each_range():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text()
    section = doc.split("### train")[1].split("### schedule")[0]
    for name, s in HYPERPARAMETERS.items():
        if s.kind in ("int", "number"):
            (row,) = [line for line in section.splitlines() if line.startswith(f"| `{name}` |")]
            assert f"({s.range_text().replace(' and ', ', ')})" in row, (name, row)


def test_is_bound_needs_stale_rollouts():
    errs = codes("train r with grpo { is_bound = 3.0 }")
    assert [c for c, _ in errs] == ["E107"] and "max_staleness" in errs[0][1], errs
    assert codes("train r with grpo { is_bound = 3.0; max_staleness = 1 }") == []
