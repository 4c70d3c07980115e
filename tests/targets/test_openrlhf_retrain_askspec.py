"""A retrain stage a PPO job cannot run (it samples its items from a role, `sample = GAME`,
or stops at a reward plateau, `keep = plateau(...)`) in the OpenRLHF job: retrain.sh runs
it with askspec's own trainer (`askspec run --stage NAME`, whose command line askspec's
parser and validation accept), the other trained roles on the weights the stages before
left, and copies the checkpoint the stage kept to the driver's SAVE_PATH, which the next
stages then use. SOAR compiles so in both profiles, its student after the RL stage being
the inner-loop service's kept (most accurate) promoted copy."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from askspec.cli import build_parser, main
from askspec.runtime.commands.options import RunOptions

SPECS = Path(__file__).parent / "specs"
ROOT = Path(__file__).resolve().parents[2]

# an `askspec` that logs its arguments and leaves a finished run (latest checkpoint: step 3) under --out
ASKSPEC_STUB = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$STUB_LOG"
prev=""; for a in "$@"; do if [ "$prev" = --out ]; then out="$a"; fi; prev="$a"; done
run="$out/20260101-000000-retrain_sampled-abcdef"
mkdir -p "$run/checkpoints/s/step-3" "$run/checkpoints/s/step-2"
echo '{"step": 3, "roles": {"s": "s/step-3"}}' > "$run/checkpoints/latest.json"
echo kept > "$run/checkpoints/s/step-3/config.json"
echo earlier > "$run/checkpoints/s/step-2/config.json"
echo "a progress line"
echo "$run"
"""


def compile_to(tmp_path: Path, spec: Path, *options: str) -> Path:
    out = tmp_path / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(out), *options]) == 0
    return out


def test_retrain_sh_trains_the_stage_with_askspec_and_hands_on_the_kept_checkpoint(tmp_path) -> None:
    job = compile_to(tmp_path, SPECS / "retrain_sampled.ask")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "askspec").write_text(ASKSPEC_STUB)
    (stubs / "askspec").chmod(0o755)
    log, save = tmp_path / "askspec.args", tmp_path / "ckpt" / "stage-2-fresh"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log), "SAVE_PATH": str(save),
           "CKPT_T": "/ckpt/iter-1/t", "ASKSPEC_RUNS": str(tmp_path / "runs")}
    done = subprocess.run(["bash", str(job / "stage-2-fresh" / "retrain.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    argv = log.read_text().splitlines()
    assert argv[:4] == ["run", "spec/retrain_sampled.ask", "--stage", "fresh"]
    assert argv[argv.index("--model") + 1] == "t=hf:/ckpt/iter-1/t"  # the trained t, not its initial weights
    opts = RunOptions.from_args(build_parser().parse_args(argv))  # askspec's own validation of the combination
    assert (opts.stage, opts.eval_only, opts.models) == ("fresh", False, {"t": "hf:/ckpt/iter-1/t"})
    assert (save / "config.json").read_text() == "kept\n"  # the newest checkpoint: the step the stage kept
    assert (job / "stage-2-fresh" / "spec" / "retrain_sampled.ask").exists()  # the spec askspec run reads
    driver = (job / "driver.sh").read_text()
    call = 'CKPT_T="$CKPT_T" CKPT_S="$CKPT_S" SAVE_PATH="$out" bash stage-2-fresh/retrain.sh'
    assert call in driver
    after = driver[driver.index(call):]
    assert 'CKPT_S="$out"' in after and after.index('CKPT_S="$out"') < after.index("stage-3-after/evaluate.sh")


def test_every_soar_profile_compiles_with_its_new_stages_mapped(tmp_path) -> None:
    for profile in ("grounded", "intrinsic_t"):
        job = compile_to(tmp_path / profile, ROOT / "specs" / "soar.ask", "--profile", profile)
        retrain = (job / "stage-7-teacher_student" / "retrain.sh").read_text()
        assert "askspec run spec/soar.ask --stage teacher_student --profile " + profile in retrain
        assert '--model teacher=hf:"${CKPT_TEACHER:-' in retrain  # sampled from the trained teacher
        assert (job / "stage-5-hard_only" / "retrain.sh").exists()  # its plateau: askspec's trainer too
        driver = (job / "driver.sh").read_text()
        if profile == "grounded":  # keep = best(accuracy): the service's most accurate promoted copy
            assert 'CKPT_STUDENT="$ASKSPEC_INNER_STATE/kept"' in driver and "/promoted\"" not in driver
        json.loads((job / "job.json").read_text())


def test_a_stage_run_trains_one_retrain_stage_and_refuses_promoted_ones() -> None:
    import pytest

    from askspec.lang.compiler import compile_file
    from askspec.runtime.commands.options import UsageError
    from askspec.runtime.commands.start import one_stage

    exp = compile_file(str(ROOT / "specs" / "soar.ask")).ir
    assert exp is not None
    alone = one_stage(exp, "teacher_student")
    assert [s.name for s in alone.stages] == ["teacher_student"] and alone.training == exp.training
    with pytest.raises(UsageError, match="promoted datasets of the run's nested schedule"):
        one_stage(exp, "pq_student")  # its items are the run's promotions, which a stage run does not have
    with pytest.raises(UsageError, match="no retrain stage of that name .did you mean .teacher_student.?."):
        one_stage(exp, "teacher_studnet")
