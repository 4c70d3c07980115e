"""A retrain stage a PPO job cannot run (it samples its items from a role, `sample = GAME`,
or stops at a reward plateau, `keep = plateau(...)`) in the OpenRLHF job: retrain.sh runs
it with askspec's own trainer (`askspec run --stage NAME`, whose command line askspec's
parser and validation accept), the other trained roles on the weights the stages before
left, and copies the checkpoint the stage kept to the driver's SAVE_PATH, which the next
stages then use. SOAR compiles so in both profiles, its student after the RL stage being
the inner-loop service's kept (most accurate) promoted copy. A retrain stage on the nested
schedule's promoted datasets (`promoted = true`: SOAR's pq_student) runs so too, its
datasets read from the service's state file (`--promotions`)."""

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
run="$out/20260101-000000-retrain_sampled-abcdef"; r=${STUB_ROLE:-s}
mkdir -p "$run/checkpoints/$r/step-3" "$run/checkpoints/$r/step-2"
echo '{"step": 3}' > "$run/checkpoints/latest.json"
echo kept > "$run/checkpoints/$r/step-3/config.json"
echo earlier > "$run/checkpoints/$r/step-2/config.json"
echo "a progress line"
echo "$run"
"""


def compile_to(tmp_path: Path, spec: Path, *options: str) -> Path:
    out = tmp_path / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(out), *options]) == 0
    return out


def run_retrain_sh(tmp_path: Path, script: Path, **env: str) -> list[str]:
    """retrain.sh run with a stub `askspec` (ASKSPEC_STUB) first on PATH: the arguments it was given."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "askspec").write_text(ASKSPEC_STUB)
    (stubs / "askspec").chmod(0o755)
    log = tmp_path / "askspec.args"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log),
                               "ASKSPEC_RUNS": str(tmp_path / "runs"), **env})
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines()


def test_retrain_sh_trains_the_stage_with_askspec_and_hands_on_the_kept_checkpoint(tmp_path) -> None:
    job = compile_to(tmp_path, SPECS / "retrain_sampled.ask")
    save = tmp_path / "ckpt" / "stage-2-fresh"
    argv = run_retrain_sh(tmp_path, job / "stage-2-fresh" / "retrain.sh", SAVE_PATH=str(save), CKPT_T="/ckpt/iter-1/t")
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
        assert '--model teacher=hf:"$CKPT_TEACHER"' in retrain  # sampled from the trained teacher
        assert "\nCKPT_TEACHER=${CKPT_TEACHER-" in retrain
        assert (job / "stage-5-hard_only" / "retrain.sh").exists()  # its plateau: askspec's trainer too
        driver = (job / "driver.sh").read_text()
        if profile == "grounded":  # keep = best(accuracy): the service's most accurate promoted copy
            assert 'CKPT_STUDENT="$ASKSPEC_INNER_STATE/kept"' in driver and "/promoted\"" not in driver
        json.loads((job / "job.json").read_text())


def test_a_stage_run_trains_one_retrain_stage_and_needs_the_promotions_of_promoted_ones() -> None:
    import pytest

    from askspec.lang.compiler import compile_file
    from askspec.runtime.commands.options import UsageError
    from askspec.runtime.commands.start import one_stage

    exp = compile_file(str(ROOT / "specs" / "soar.ask")).ir
    assert exp is not None
    alone = one_stage(exp, "teacher_student")
    assert [s.name for s in alone.stages] == ["teacher_student"] and alone.training == exp.training
    with pytest.raises(UsageError, match="promoted datasets of the run's nested schedule.*--promotions FILE"):
        one_stage(exp, "pq_student")  # its items are the run's promotions, which a stage run does not have
    assert [s.name for s in one_stage(exp, "pq_student", promotions=True).stages] == ["pq_student"]
    # Intrinsic-T runs no inner loop: nothing is promoted, the stage trains on its data set alone
    intrinsic = compile_file(str(ROOT / "specs" / "soar.ask"), profile="intrinsic_t").ir
    assert [s.name for s in one_stage(intrinsic, "pq_student").stages] == ["pq_student"]
    with pytest.raises(UsageError, match="no retrain stage of that name .did you mean .teacher_student.?."):
        one_stage(exp, "teacher_studnet")
    for wrong in ({}, {"stage": "ps", "eval_only": True}):  # --promotions is a retrain stage's
        with pytest.raises(UsageError, match="--promotions .* use it with --stage NAME, without --eval-only"):
            RunOptions(file="soar.ask", promotions="state.json", **wrong)


def test_soars_promoted_retrain_stage_reads_the_services_state_in_the_job(tmp_path, capsys) -> None:
    for profile in ("grounded", "intrinsic_t"):
        job = compile_to(tmp_path / profile, ROOT / "specs" / "soar.ask", "--profile", profile)
        assert "W601" not in capsys.readouterr().err  # every stage the paper uses is part of the job
        save = tmp_path / profile / "ckpt" / "stage-3-pq_student"
        argv = run_retrain_sh(tmp_path / profile, job / "stage-3-pq_student" / "retrain.sh", SAVE_PATH=str(save),
                              STUB_ROLE="student", CKPT_TEACHER="/ckpt/teacher", ASKSPEC_INNER_STATE="/state")
        opts = RunOptions.from_args(build_parser().parse_args(argv))
        assert (opts.stage, opts.eval_only, opts.profile, opts.models) == (
            "pq_student", False, profile, {"teacher": "hf:/ckpt/teacher"})
        # the promoted datasets: the service's state file in driver.sh's ASKSPEC_INNER_STATE (Intrinsic-T
        # runs no inner loop: nothing is promoted, and the job has no service)
        assert opts.promotions == ("/state/state.json" if profile == "grounded" else None)
        assert (save / "config.json").read_text() == "kept\n"  # the student for the stages after it
        driver = (job / "driver.sh").read_text()
        assert ("\nexport ASKSPEC_INNER_STATE\n" in driver) == (profile == "grounded")
        after = driver[driver.index('SAVE_PATH="$out" bash stage-3-pq_student/retrain.sh'):]
        assert after.index('CKPT_STUDENT="$out"') < after.index("stage-4-pq/evaluate.sh")  # pq evaluates it


def test_a_stage_run_trains_on_the_promoted_datasets_of_a_services_state_file(tmp_path, tiny_model) -> None:
    import asyncio

    from askspec.runtime.commands.run import run_spec
    from askspec.runtime.store.views import open_store

    # the service's state file after two promotions (InnerLoopHost._save: its answer's promotions)
    promoted = [[{"question": "11+1?", "answer": "12"}], [{"question": "20+3?", "answer": "23", "text": "x"}]]
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"step": 2, "key": "session-b", "answer": {"step": 2, "promoted": True, "promotions": [
        {"step": n, "dataset": 1, "copy": 1, "items": items} for n, items in enumerate(promoted, 1)]}}))
    spec = str(ROOT / "tests" / "train" / "specs" / "tiny_pq.ask")
    weights = {"weights": f'"{tiny_model}"'}
    rc, run = asyncio.run(run_spec(spec, stage="pq_student", set=weights, out=str(tmp_path / "refused")))
    assert rc != 0 and run is None  # without them the stage would train on the data set alone: refused
    rc, run = asyncio.run(run_spec(spec, stage="pq_student", promotions=str(state), set=weights,
                                   out=str(tmp_path / "runs")))
    assert rc == 0 and run is not None
    rows = open_store(Path(run)).execute("SELECT step, params->>'$.qa.question' FROM sessions WHERE stage = "
                                         "'pq_student' ORDER BY index").fetchall()
    # curriculum = 1: step 1 plays the promoted questions alone, in promotion order; then the data set
    assert [q for step, q in rows if step == 1] == ["11+1?", "20+3?"]
    assert {q for step, q in rows if step > 1} <= {"2+2?", "3+5?"} and max(step for step, _ in rows) == 3
    manifest = json.loads((Path(run) / "manifest.json").read_text())
    assert manifest["run_options"]["promotions"] == str(state)  # a resumed run reads them again


def test_promotions_must_be_a_regular_file_within_the_size_limit(tmp_path, monkeypatch, capsys) -> None:
    """--promotions FILE is read whole: a FIFO is refused rather than waited on for good,
    /dev/zero and a folder rather than read, and a file past the limit with the limit
    named; each one `error:` line, exit 1, as the command's other usage errors."""
    import sys

    fifo = tmp_path / "state.fifo"
    os.mkfifo(fifo)
    argv = ["run", str(ROOT / "specs" / "soar.ask"), "--stage", "pq_student", "--out", str(tmp_path / "runs")]
    # a process of its own, so that a read that waits on the FIFO fails the test rather than hanging it
    done = subprocess.run([sys.executable, "-m", "askspec.cli", *argv, "--promotions", str(fifo)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"error: --promotions: {fifo} is a FIFO (named pipe), not a regular file "
                                        f"(the inner-loop service's state file: the job's "
                                        f"$ASKSPEC_INNER_STATE/state.json)"]
    for path, what in (("/dev/zero", "a character device"), (str(tmp_path), "a folder")):
        assert main([*argv, "--promotions", path]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: --promotions: {path} is {what}, not a regular file") and err.count("\n") == 1
    big = tmp_path / "state.json"
    big.write_text(json.dumps({"answer": {"promotions": []}}) + " " * 100)
    import askspec.lang.paths as paths

    monkeypatch.setattr(paths, "MAX_STATE_BYTES", 64)
    assert main([*argv, "--promotions", str(big)]) == 1
    err = capsys.readouterr().err
    assert f"error: --promotions: {big} is {big.stat().st_size} bytes; the limit is 64 bytes" in err
    assert "Traceback" not in err and err.count("\n") == 1
    monkeypatch.setattr(paths, "MAX_STATE_BYTES", 1 << 20)
    from askspec.runtime.train.promotions import read_promotions

    assert read_promotions(big) == []  # under the limit it is read as before
