"""Every setting a `train` block may give (askspec/lang/training.py: the hyperparameters,
the buffer and gate settings, every algorithm's arguments) is either mapped — the launch
line changes and OpenRLHF 0.11.2's own parser and validation accept it — or refused with
a diagnostic that names it. Never accepted and ignored."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.lang.compiler import compile_file
from askspec.diagnostics import DiagnosticSink
from askspec.lang.training import ALGORITHM_ARGS, BUFFER_SETTINGS, GATE_SETTINGS, HYPERPARAMETERS
from askspec.runtime.targets.openrlhf.check import check
from askspec.runtime.targets.openrlhf.mapping import MISSING, REFUSED, SETTINGS

from openrlhf_harness import launch_argv, parse_train_ppo_ray, train_flags

LANGUAGE = {*HYPERPARAMETERS, *BUFFER_SETTINGS, *GATE_SETTINGS, *(k for args in ALGORITHM_ARGS.values() for k in args)}

SPEC = """
model m = hf("smollm2-135m-instruct") {{ max_tokens = 32 }}
role s {{ model = m; trained }}
buffer seen {{ capacity = 10; fields = {{x: number}} }}
game practice for x in [1, 2, 3, 4] {{
    a = ask s using "Solve {{{{ x }}}}."
    score = 1.0
    reward s = score
    push seen: {{x: x}}
}}
train s with {algorithm} {{ {block} }}
"""

# setting -> (the block's text for it, context both runs share); the algorithm is grpo
# unless the setting is an argument only another algorithm has
VALUES = {
    "group": ("group = 4", ""), "steps": ("steps = 6", ""), "batch": ("batch = 4", ""),
    "micro_batch": ("micro_batch = 2", ""), "epochs": ("epochs = 2", ""), "lr": ("lr = 0.00002", ""),
    "warmup": ("warmup = 1", "steps = 4"), "decay": ("decay = cosine", ""),
    "min_lr": ("min_lr = 0.0000001", "decay = cosine"), "weight_decay": ("weight_decay = 0.1", ""),
    "beta1": ("beta1 = 0.8", ""), "beta2": ("beta2 = 0.99", ""), "grad_clip": ("grad_clip = 0.5", ""),
    "kl": ("kl = 0.1", ""), "kl_estimator": ("kl_estimator = k1", "kl = 0.1"),
    "aggregation": ("aggregation = sequence", ""), "save_every": ("save_every = 5", ""),
    "keep_checkpoints": ("keep_checkpoints = 4", ""), "max_nonfinite_steps": ("max_nonfinite_steps = 5", ""),
    "dtype": ("dtype = bfloat16", ""), "replay": ("replay = seen", ""), "std": ("std = population", ""),
    "update_when": ("update_when = sum(score) > 0", ""),
    "max_staleness": ("max_staleness = 2", ""), "is_bound": ("is_bound = 3.0", "max_staleness = 1"),
    "max_mismatch": ("max_mismatch = 0.01", ""), "on_mismatch": ("on_mismatch = error", ""),
    "clip": ("(clip = 0.3)", ""), "clip_low": ("(clip_low = 0.1)", ""), "clip_high": ("(clip_high = 0.4)", ""),
    "dual_clip": ("(dual_clip = 3.0)", ""), "estimator": ("(estimator = rloo)", ""), "min_reward": ("(min_reward = 0.5)", ""),
}


def algorithm_for(key: str) -> str:
    """grpo, else the first algorithm the target supports that takes `key` (else one it refuses)."""
    takes = [a for a, args in ALGORITHM_ARGS.items() if key in args]
    if not takes or "grpo" in takes:
        return "grpo"
    return next((a for a in takes if a not in MISSING), takes[0])


def spec_text(key: str, with_setting: bool) -> str:
    text, context = VALUES[key]
    algorithm = algorithm_for(key)
    group = "" if key == "group" and with_setting else "group = 2"  # grouped estimators need a group
    if text.startswith("("):
        return SPEC.format(algorithm=algorithm + (text if with_setting else ""), block=f"{group}; {context}")
    return SPEC.format(algorithm=algorithm, block="; ".join(x for x in (group, context, text if with_setting else "") if x))


def test_every_setting_is_in_the_walk() -> None:
    assert set(VALUES) == LANGUAGE  # a new language setting must be added here (and mapped or refused)
    assert set(SETTINGS) | set(REFUSED) == LANGUAGE and not set(SETTINGS) & set(REFUSED)


def refusals(spec: Path) -> list[str]:
    old = os.getcwd()
    os.chdir(spec.parent)
    try:
        res = compile_file(spec.name)
        assert res.ok, [d.message for d in res.sink.sorted()]
        sink = DiagnosticSink()
        check(res.ir, res.sources, spec.name, {}, sink)
    finally:
        os.chdir(old)
    return [d.message for d in sink.sorted() if d.code.startswith("E6")]


def launch_line(tmp: Path, text: str) -> list[str]:
    """The train_ppo_ray flags of the spec's job."""
    return train_flags(launch_call(tmp, text))


def launch_call(tmp: Path, text: str) -> list[str]:
    """The job's `ray job submit` call: its runtime environment, entry point and flags."""
    tmp.mkdir()
    (tmp / "w.ask").write_text(text)
    assert main(["compile", str(tmp / "w.ask"), "--target", "openrlhf", "-o", str(tmp / "job")]) == 0
    return launch_argv(tmp / "job" / "launch.sh", tmp)[0]


@pytest.mark.parametrize("key", sorted(VALUES))
def test_setting_is_mapped_or_refused_by_name(tmp_path, key) -> None:
    spec = tmp_path / "w.ask"
    spec.write_text(spec_text(key, True))
    errors = refusals(spec)
    if key in SETTINGS:
        assert errors == [], errors
        # the entry point is part of the line: `std = population` and `update_when` start OpenRLHF
        # through the job's askspec_ext, which hooks them in (with OpenRLHF's own flags)
        with_it = launch_call(tmp_path / "with", spec_text(key, True))
        without = launch_call(tmp_path / "without", spec_text(key, False))
        entry = with_it.index("--") + 3
        assert with_it[entry:] != without[entry:], f"{key} changes nothing in the launch line"
        parse_train_ppo_ray(train_flags(with_it))  # OpenRLHF's own parser and validation
    else:
        assert key in REFUSED
        assert any(f"'{key}'" in m or f"`{key} =" in m for m in errors), errors


def test_sample_std_is_openrlhfs_own(tmp_path) -> None:
    spec = tmp_path / "w.ask"
    spec.write_text(SPEC.format(algorithm="grpo", block="group = 2; std = sample"))
    assert refusals(spec) == []


def test_float32_is_refused_by_name(tmp_path) -> None:
    spec = tmp_path / "w.ask"
    spec.write_text(SPEC.format(algorithm="grpo", block="group = 2; dtype = float32"))
    assert any("`dtype = float32`" in m for m in refusals(spec))


def test_checkpoint_settings_reach_their_flags(tmp_path) -> None:
    args = parse_train_ppo_ray(launch_line(tmp_path / "a", SPEC.format(algorithm="grpo",
                                                                        block="group = 2; save_every = 5; keep_checkpoints = 4")))
    assert (args.ckpt.save_steps, args.ckpt.max_num) == (5, 4)
    default = parse_train_ppo_ray(launch_line(tmp_path / "b", SPEC.format(algorithm="grpo", block="group = 2")))
    # askspec's defaults, not OpenRLHF's (no intermediate checkpoint, three kept)
    assert (default.ckpt.save_steps, default.ckpt.max_num) == (HYPERPARAMETERS["save_every"].default,
                                                                HYPERPARAMETERS["keep_checkpoints"].default)


def test_staleness_reaches_the_async_trainer(tmp_path) -> None:
    args = parse_train_ppo_ray(launch_line(tmp_path / "a", SPEC.format(
        algorithm="grpo", block="group = 2; max_staleness = 2; is_bound = 3.0")))
    assert (args.train.async_enable, args.train.async_queue_size) == (True, 2)
    assert (args.algo.advantage.is_correction_level, args.algo.advantage.is_correction_mode) == ("token", "clip")
    assert list(args.algo.advantage.is_correction_threshold) == [0.0, 3.0]
    default = parse_train_ppo_ray(launch_line(tmp_path / "b", SPEC.format(algorithm="grpo", block="group = 2")))
    assert not default.train.async_enable and default.algo.advantage.is_correction_level == "off"


def test_staleness_needs_a_loss_with_the_correction(tmp_path) -> None:
    """gspo takes the sampler's log-probs into its ratio instead of OpenRLHF's TIS weight;
    ppo and askspec_ext's cispo apply the weight (test_openrlhf_cispo.py)."""
    for algorithm, refused in (("gspo", True), ("cispo", False)):
        spec = tmp_path / f"w_{algorithm}.ask"
        spec.write_text(SPEC.format(algorithm=algorithm, block="group = 2; max_staleness = 1"))
        assert any(f"`max_staleness = 1` with the {algorithm} loss" in m for m in refusals(spec)) == refused


def test_a_blocks_own_steps_win_over_the_online_schedules_as_in_a_local_run(tmp_path) -> None:
    """The compiler lowers a train block's `steps` over `schedule online { steps }` (the
    block's are its own); the job runs the same number of optimizer steps, with its learning
    rate laid over them (before: the schedule's 7 steps, against a local run's 3)."""
    import json

    from askspec.lang.compiler import compile_source

    text = SPEC.format(algorithm="grpo", block="group = 2; steps = 3").replace("buffer seen", "schedule online { steps = 7 }\nbuffer seen")
    local = compile_source("w.ask", text)
    assert local.ok and local.ir is not None and local.ir.training[0].config.steps == 3  # type: ignore[union-attr]
    args = parse_train_ppo_ray(launch_line(tmp_path / "a", text))
    # 4 elements, each step's prompts all of them (no `batch`): one step a pass, so 3 passes
    assert (args.rollout.batch_size, args.train.num_episodes) == (4, 3)
    job = json.loads((tmp_path / "a" / "job" / "job.json").read_text())
    assert job["extension"]["lr_schedule"]["steps"] == 3
    schedule_only = SPEC.format(algorithm="grpo", block="group = 2").replace("buffer seen", "schedule online { steps = 7 }\nbuffer seen")
    assert parse_train_ppo_ray(launch_line(tmp_path / "b", schedule_only)).train.num_episodes == 7
