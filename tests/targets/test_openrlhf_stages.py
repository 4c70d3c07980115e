"""A spec's stages in the OpenRLHF job: an `sft` stage's launch line is accepted by
openrlhf.cli.train_sft's own parser and validation and its data set is read by OpenRLHF's
own SFT preprocessing; an `evaluate` stage serves the role's latest checkpoint (and its
initial weights) with vLLM and plays the stage with `askspec run --eval-only --stage`,
whose command line askspec's own parser accepts; driver.sh runs the stages in the spec's
order, chaining checkpoints, and resumes at the first unfinished one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.cli import build_parser, main
from askspec.runtime.commands.options import RunOptions

from openrlhf_harness import launch_argv, parse_train_ppo_ray, parse_train_sft, sft_flags, smollm2_tokenizer, train_flags

SPECS = Path(__file__).parent / "specs"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def compile_to(tmp_path: Path, spec: Path, options: list[str] | None = None) -> Path:
    out = tmp_path / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(out), *(options or [])]) == 0
    return out


def test_stages_run_in_order_and_chain_checkpoints(tmp_path) -> None:
    job = compile_to(tmp_path, SPECS / "stages.ask")
    calls = launch_argv(job / "driver.sh", tmp_path)
    assert [c[0] for c in calls if c[0] in ("deepspeed", "ray", "askspec")] == ["deepspeed", "ray", "askspec", "askspec"]
    ckpt = job / "ckpt"
    (sft,) = [parse_train_sft(sft_flags(c)) for c in calls if c[0] == "deepspeed"]
    assert sft.model.model_name_or_path == BASE  # the cold start begins from the spec's weights
    assert sft.ckpt.output_dir == f"{ckpt}/stage-1-cold_start"
    assert (sft.data.dataset, sft.data.input_key, sft.data.output_key) == ("sft.jsonl", "prompt", "completion")
    assert sft.data.apply_chat_template and sft.train.max_epochs == 1 and sft.train.batch_size == 2
    assert sft.adam.lr == pytest.approx(2e-5) and tuple(sft.adam.betas) == (0.9, 0.999)  # the stage's lr, askspec's β
    assert sft.lr_scheduler == "constant_with_warmup" and sft.lr_warmup_ratio == 0
    # 3 steps of 2 records over a data set of 2: the records in askspec's order, one pass
    records = [json.loads(x) for x in (job / "stage-1-cold_start" / "sft.jsonl").read_text().splitlines()]
    assert [r["completion"][0]["content"] for r in records] == ["\\boxed{2}", "\\boxed{4}"] * 3
    assert records[0]["prompt"] == [{"role": "system", "content": "Answer in a box."},
                                    {"role": "user", "content": "What is 1 + 1?"}]
    # the RL job starts from the cold start's weights
    (rl,) = [parse_train_ppo_ray(train_flags(c)) for c in calls if c[0] == "ray"]
    assert rl.actor.model_name_or_path == f"{ckpt}/stage-1-cold_start"
    assert rl.ckpt.output_dir == f"{ckpt}/iter-1/s"
    # the evaluate stage: the trained weights, then the initial ones, each served and played
    served = [c[c.index("serve") + 1] for c in calls if c[0] == "vllm"]
    assert served[-2:] == [f"{ckpt}/iter-1/s", BASE]
    runs = [c[1:] for c in calls if c[0] == "askspec"]
    for argv, weights in zip(runs, ["trained", "initial"]):
        assert argv[:8] == ["run", "spec/stages.ask", "--eval-only", "--stage", "heldout", "--weights", weights,
                            "--backend"]
        args = build_parser().parse_args(argv)
        opts = RunOptions.from_args(args)  # askspec's own validation of the combination
        assert (opts.stage, opts.weights, opts.backend) == ("heldout", weights, "openai")
        assert opts.base_url == "http://127.0.0.1:8001/v1" and opts.served_models == {"": "askspec-s"}
        assert opts.out == str(job / "runs") and opts.eval_only
    assert (job / "stage-3-heldout" / "spec" / "stages.ask").exists()


def test_the_evaluate_stage_reads_the_compiles_data_files(tmp_path) -> None:
    """`askspec compile --data NAME=FILE`: the job's agent reads the user's file, and so does
    the evaluate stage's `askspec run` (the same absolute path), so that the stage plays the
    experiment that was compiled."""
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"q": "What is 2 + 5?", "a": "7"}) + "\n")
    job = compile_to(tmp_path, SPECS / "stages.ask", ["--data", f"test_qs={mine}"])
    runs = [c[1:] for c in launch_argv(job / "driver.sh", tmp_path) if c[0] == "askspec"]
    assert len(runs) == 2
    for argv in runs:
        opts = RunOptions.from_args(build_parser().parse_args(argv))
        assert opts.data == {"test_qs": str(mine)} and opts.stage == "heldout"
    plain = compile_to(tmp_path / "plain", SPECS / "stages.ask")
    assert "--data" not in (plain / "stage-3-heldout" / "evaluate.sh").read_text()


def test_sft_data_is_read_by_openrlhf(tmp_path) -> None:
    """OpenRLHF's own preprocessing (SFTDataset.process_data's, with the chat template as
    --data.apply_chat_template uses it) turns each record into the prompt the role is
    asked with and the completion as its reply."""
    from openrlhf.datasets.sft_dataset import preprocess_data

    job = compile_to(tmp_path, SPECS / "stages.ask")
    tokenizer = smollm2_tokenizer()
    line = (job / "stage-1-cold_start" / "sft.jsonl").read_text().splitlines()[1]
    prompt, response = preprocess_data(json.loads(line), None, "prompt", "completion", tokenizer.apply_chat_template)
    assert prompt.startswith("<|im_start|>system\nAnswer in a box.<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?")
    assert prompt.endswith("<|im_start|>assistant\n")
    assert response.startswith("\\boxed{4}<|im_end|>")


def test_driver_resumes_at_the_first_unfinished_stage(tmp_path) -> None:
    job = compile_to(tmp_path, SPECS / "stages.ask")
    failed = launch_argv(job / "driver.sh", tmp_path, fail="askspec")  # the evaluation run fails
    assert [c[0] for c in failed if c[0] in ("deepspeed", "ray", "askspec")] == ["deepspeed", "ray", "askspec"]
    assert sorted(p.name for p in (job / "done").iterdir()) == ["iter-1-s", "stage-1-cold_start"]
    again = launch_argv(job / "driver.sh", tmp_path)
    assert [c[0] for c in again if c[0] in ("deepspeed", "ray", "askspec")] == ["askspec", "askspec"]
    served = [c[c.index("serve") + 1] for c in again if c[0] == "vllm"]
    assert served == [str(job / "ckpt" / "iter-1" / "s"), BASE]  # the trained weights are the finished phase's
    assert [c for c in launch_argv(job / "driver.sh", tmp_path) if c[0] != "curl"] == []  # all done


def test_retrain_stage_is_a_fresh_ppo_job_on_its_data(tmp_path) -> None:
    job = compile_to(tmp_path, SPECS / "retrain.ask")
    calls = launch_argv(job / "driver.sh", tmp_path)
    rays = [parse_train_ppo_ray(train_flags(c)) for c in calls if c[0] == "ray"]
    assert len(rays) == 2
    fresh = rays[1]
    assert fresh.actor.model_name_or_path == BASE  # a fresh copy: the spec's weights, not the trained ones
    assert fresh.ckpt.output_dir == str(job / "ckpt" / "stage-4-again")
    assert fresh.actor.adam.lr == pytest.approx(3e-6) and fresh.algo.advantage.estimator == "group_norm"
    labels = [json.loads(json.loads(x)["label"]) for x in (job / "stage-4-again" / "prompts.jsonl").read_text().splitlines()]
    assert [(x["game"], x["bindings"]["x"]) for x in labels] == [("practice", 7), ("practice", 8)]  # the stage's data
    # the evaluation after it plays the retrained copy
    served = [c[c.index("serve") + 1] for c in calls if c[0] == "vllm"]
    assert served[-1:] == [str(job / "ckpt" / "stage-4-again")]


def test_askspec_run_plays_one_evaluate_stage(tmp_path, capsys) -> None:
    """What evaluate.sh runs: only the stage's games, `samples` sessions per element,
    recorded as the stage and the weights, so `askspec metrics` reports its pass@k."""
    spec = SPECS / "retrain.ask"
    argv = ["run", str(spec), "--eval-only", "--stage", "heldout", "--weights", "initial", "--model",
            "s=python:openrlhf_harness:boxed_three", "--out", str(tmp_path / "runs"), "--quiet"]
    assert main(argv) == 0
    (run,) = (tmp_path / "runs").iterdir()
    capsys.readouterr()
    assert main(["metrics", str(run), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    got = {(r["stage"], r["metric"], r["by"]["weights"]): (r["value"], r["n"]) for r in rows if r.get("stage")}
    assert got[("heldout", "pass@1", "initial")] == (1.0, 1)  # the one held-out item, answered right
    assert got[("heldout", "pass@1", "trained")] == (None, 0)  # the other weights are another run's
    # not the training game, nor the other evaluate stage's
    assert main(["query", str(run), "select game, count(*) as n from sessions group by game", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"game": "test", "n": 1}]
    assert main(["runs", str(tmp_path / "runs")]) == 0  # how it ran, as one would type it again
    assert "--eval-only --stage heldout --weights initial" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--stage", "heldout"], "without --eval-only trains one retrain stage: no retrain stage of that name"),
    (["--stage", "again", "--weights", "initial"], "a retrain stage trains the models as given"),
    (["--eval-only", "--stage", "nope"], "no evaluate stage of that name"),
    (["--eval-only", "--weights", "initial"], "with --stage"),
    (["--eval-only", "--stage", "heldout", "--sessions", "1"], "cannot be combined with --sessions"),
])
def test_stage_flag_errors(tmp_path, capsys, argv, message) -> None:
    assert main(["run", str(SPECS / "stages.ask"), *argv, "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec,options", [
    ("ask_e.ask", ["--profile", "training", "--substitute", "cispo=grpo"]),
    ("reasoning_arena.ask", ["--profile", "cpu", "--substitute", "cispo=grpo", "--set", "advantage_std=sample"]),
])
def test_paper_specs_run_their_stages(tmp_path, spec, options) -> None:
    """The papers' specs: the RL job, then the evaluate stage on the trained and the
    initial weights, every line accepted by its program's own parser."""
    job = compile_to(tmp_path, ROOT / "specs" / spec, options)
    calls = launch_argv(job / "driver.sh", tmp_path)
    (rl,) = [parse_train_ppo_ray(train_flags(c)) for c in calls if c[0] == "ray"]
    runs = [RunOptions.from_args(build_parser().parse_args(c[1:])) for c in calls if c[0] == "askspec"]
    assert [(o.stage, o.weights) for o in runs] == [(runs[0].stage, "trained"), (runs[0].stage, "initial")]
    assert all(o.profile == options[1] and o.file.startswith("spec/") for o in runs)
    stage_dir = next(job.glob("stage-*"))
    assert (stage_dir / runs[0].file).exists()  # the spec the evaluation run reads is in the stage's folder
    served = [c[c.index("serve") + 1] for c in calls if c[0] == "vllm"]
    assert served[-2:] == [rl.ckpt.output_dir, rl.actor.model_name_or_path]
