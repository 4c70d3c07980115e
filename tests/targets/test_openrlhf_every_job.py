"""Every seed spec that trains, under each of its profiles, compiles to an OpenRLHF job
(no --substitute) whose every launch line is accepted by the program it calls: each
phase's `ray job submit ... train_ppo_ray` by OpenRLHF 0.11.2's own parser and validation,
each sft stage's `deepspeed ... train_sft` likewise, each evaluate stage's `askspec run` by
askspec's own. (Retrain stages run askspec's trainer through retrain.sh, whose command
lines test_openrlhf_retrain_askspec.py parses.) A profile the target refuses must be one
docs/cluster.md lists as refused."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from openrlhf_harness import launch_argv, parse_train_ppo_ray, parse_train_sft, sft_flags, train_flags

from askspec.cli import build_parser, main
from askspec.runtime.commands.options import RunOptions

ROOT = Path(__file__).resolve().parents[2]
# refusals docs/cluster.md names (none since two roles updated every step became a multi-policy job)
REFUSED: set[tuple[str, str]] = set()


def _cases() -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for spec in sorted((ROOT / "specs").glob("*.ask")):
        text = spec.read_text()
        if not re.search(r"^train \w+", text, re.M):
            continue  # nothing to train: no job (E607)
        out += [(spec.name, p) for p in re.findall(r"^profile (\w+)", text, re.M) or [None]]
    return out


CASES = _cases()


def test_the_cases_cover_the_five_experiments_and_their_profiles():
    specs = {s for s, _ in CASES}
    assert {"ask_e.ask", "askbench.ask", "pasodoble.ask", "reasoning_arena.ask", "soar.ask"} <= specs
    assert len([p for s, p in CASES if s == "askbench.ask"]) == 6 and ("soar.ask", "intrinsic_t") in CASES


@pytest.mark.parametrize("spec,profile", CASES, ids=[f"{s[:-4]}-{p or 'default'}" for s, p in CASES])
def test_every_launch_line_of_every_profile_parses(tmp_path, job_extension, spec, profile, capsys):
    job = tmp_path / "job"
    chosen = ["--profile", profile] if profile else []
    rc = main(["compile", str(ROOT / "specs" / spec), *chosen, "--target", "openrlhf", "-o", str(job)])
    err = capsys.readouterr().err
    if (spec, profile) in REFUSED:
        assert rc == 1 and "error[E602]" in err and not job.exists()
        assert f"{spec[:-4]}" in (ROOT / "docs" / "cluster.md").read_text()
        return
    assert rc == 0, err
    assert "W601" not in err  # every stage is part of the job (an evaluate stage's frozen roles served beside it)
    # launch.sh's own ACTOR_NODES and ACTOR_GPUS: a job cannot fail on its defaults
    env = {"VLLM_ENGINES": "2", "SAVE_PATH": str(tmp_path / "out"),
           "PRETRAIN": str(tmp_path / "weights"), "CKPT_PATH": str(tmp_path / "ckpt")}
    # a multi-policy job's top launch.sh (several roles' arguments): test_openrlhf_multi_policy.py parses it
    multi = (job / "job.json").exists() and json.loads((job / "job.json").read_text()).get("kind") == "multi_policy"
    launches = ([] if multi else sorted(job.glob("launch.sh"))) + sorted(job.glob("phase-*/launch.sh"))
    assert launches, "a job launches OpenRLHF at least once"
    for script in launches:
        calls = [c for c in launch_argv(script, tmp_path, env) if c[0] == "ray"]
        assert len(calls) == 1, script
        flags = train_flags(calls[0])
        if "cispo" in flags:  # the loss the job's extension adds to OpenRLHF's choices
            cispo, _ = job_extension(script.parent)
            with cispo.parser_accepts_cispo():
                args = parse_train_ppo_ray(flags)
        else:
            args = parse_train_ppo_ray(flags)
        rollouts = args.rollout.n_samples_per_prompt * args.rollout.batch_size
        # DeepSpeed's batch rule holds for the default actor GPUs (OpenRLHF's own is in its parser)
        world = args.actor.num_nodes * args.actor.num_gpus_per_node
        assert args.train.batch_size % (args.train.micro_batch_size * world) == 0 and world <= rollouts, script
        # more actor processes than a step has rollouts: launch.sh says so before submitting
        # (OpenRLHF's own check is a bare assert inside the job)
        over = subprocess.run(["bash", str(script)], env={**os.environ, "ACTOR_GPUS": str(rollouts + 1),
                                                           "PATH": f"{tmp_path / 'stubs'}:{os.environ['PATH']}"},
                              capture_output=True, text=True, timeout=60)
        assert over.returncode == 2 and f"trains on {rollouts} rollouts" in over.stderr, over.stderr
    for script in sorted(job.glob("stage-*/sft.sh")):
        (call,) = [c for c in launch_argv(script, tmp_path, env) if c[0] == "deepspeed"]
        parse_train_sft(sft_flags(call))
    for script in sorted(job.glob("stage-*/evaluate.sh")):
        runs = [c[1:] for c in launch_argv(script, tmp_path, env) if c[0] == "askspec"]
        assert runs, script
        for argv in runs:
            opts = RunOptions.from_args(build_parser().parse_args(argv))  # its own validation of the combination
            assert opts.eval_only and opts.stage is not None
