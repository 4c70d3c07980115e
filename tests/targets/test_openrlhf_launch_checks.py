"""Launches that cannot fail on defaults (docs/cluster.md, "Batch sizes and GPUs" and
"Sequence length"): the batch rules launch.sh checks (world.py) agree with OpenRLHF
0.11.2's own check and DeepSpeed's batch assertion; a job's default ACTOR_GPUS fits its
step, a given one that does not is refused before anything is submitted (a replaying
phase's launch.args included); max_len fits the model's context; a phase whose sessions
did not all reach the run store is not committed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.runtime.targets.openrlhf import phase_data, world

from openrlhf_harness import launch_argv, parse_train_ppo_ray, train_flags

SPECS = Path(__file__).parent / "specs"


def deepspeed_accepts(train_batch: int, micro: int, world_size: int) -> bool:
    """DeepSpeed's `_set_batch_related_parameters` then `_batch_assertion` (runtime/config.py)
    on the config OpenRLHF's DeepspeedStrategy writes: train_batch_size and
    train_micro_batch_size_per_gpu given, the accumulation steps derived."""
    grad_acc = train_batch // micro
    grad_acc //= world_size
    return train_batch > 0 and micro > 0 and grad_acc > 0 and train_batch == micro * grad_acc * world_size


def argv(n: int, prompts: int, train: int, micro: int, nodes: int, gpus: int) -> list[str]:
    return ["--rollout.n_samples_per_prompt", str(n), "--rollout.batch_size", str(prompts),
            "--train.batch_size", str(train), "--train.micro_batch_size", str(micro),
            "--actor.num_nodes", str(nodes), "--actor.num_gpus_per_node", str(gpus),
            "--algo.advantage.estimator", "reinforce", "--train.agent_func_path", "agent.py",
            "--data.prompt_dataset", "p.jsonl"]


@pytest.mark.parametrize("n,prompts", [(1, 3), (3, 2), (6, 1), (4, 2)])
def test_the_rules_are_openrlhfs_and_deepspeeds(n, prompts) -> None:
    """world.problem is None exactly when OpenRLHF's own argument checks pass (its parser
    and main block) and DeepSpeed would accept the batch, on 1 or 2 nodes of 1..8 GPUs and
    micro batches 1 and 2."""
    for micro in (1, 2):
        for nodes in (1, 2):
            for gpus in range(1, 9):
                args = argv(n, prompts, n * prompts, micro, nodes, gpus)
                try:
                    parse_train_ppo_ray(args)
                    openrlhf_ok = True
                except AssertionError:
                    openrlhf_ok = False
                ok = openrlhf_ok and deepspeed_accepts(n * prompts, micro, nodes * gpus)
                assert (world.problem(world.settings(args)) is None) == ok, (args, openrlhf_ok)


def test_settings_take_the_last_value_as_argparse_does() -> None:
    s = world.settings(["--train.batch_size", "6", "--train.batch_size=12", "--ds.ring_attn_size", "2"])
    assert s["--train.batch_size"] == 12 and s["--ds.ring_attn_size"] == 2 and s[world.DYNAMIC] == 0
    assert world.settings(["--train.dynamic_batch_enable"])[world.DYNAMIC] == 1


def compile_to(tmp_path: Path, spec: Path, *options: str) -> Path:
    out = tmp_path / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(out), *options]) == 0
    return out


def run(script: Path, tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    log = tmp_path / "ray.log"
    (stubs / "ray").write_text(f'#!/usr/bin/env bash\necho "$@" >> {log}\n')
    (stubs / "ray").chmod(0o755)
    return subprocess.run(["bash", str(script), *args], env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}",
                                                            **env}, capture_output=True, text=True, timeout=60)


def test_a_step_of_six_defaults_to_three_gpus_and_refuses_four(tmp_path) -> None:
    """PasoDoble's proposer shape (a step is one session's 6 `sample` replies): the default
    ACTOR_GPUS is 3, not 4, which DeepSpeed accepts; ACTOR_GPUS=4 is refused before
    `ray job submit`, naming the setting and the counts that fit."""
    job = compile_to(tmp_path, SPECS / "siblings.ask")
    (call,) = launch_argv(job / "launch.sh", tmp_path)
    args = parse_train_ppo_ray(train_flags(call))
    assert args.train.batch_size == 6 and args.actor.num_gpus_per_node == 3
    assert deepspeed_accepts(args.train.batch_size, args.train.micro_batch_size, 3)
    assert "ACTOR_GPUS defaults to 3, not 4" in (job / "README.md").read_text()
    done = run(job / "launch.sh", tmp_path, {"ACTOR_GPUS": "4"})
    assert done.returncode == 2 and not (tmp_path / "ray.log").exists()
    assert "DeepSpeed needs --train.batch_size (6)" in done.stderr
    assert "set ACTOR_GPUS to one of 1, 2, 3, 6 (with ACTOR_NODES=1)" in done.stderr
    done = run(job / "launch.sh", tmp_path, {"ACTOR_GPUS": "3", "ACTOR_NODES": "2"})  # 6 processes: fits
    assert done.returncode == 0, done.stderr


def test_launch_args_are_checked_too(tmp_path) -> None:
    """A replaying phase's launch.args (a short buffer: the step's batch) reach launch.sh as
    arguments: a given ACTOR_GPUS they do not fit is refused; the default is lowered to fit."""
    job = compile_to(tmp_path, SPECS / "uneven_steps.ask")
    short = ["--rollout.batch_size", "1", "--train.batch_size", "2"]  # one item of a group of 2
    done = run(job / "launch.sh", tmp_path, {"ACTOR_GPUS": "4"}, *short)
    assert done.returncode == 2 and not (tmp_path / "ray.log").exists()
    assert "trains on 2 rollouts" in done.stderr and "ACTOR_GPUS to one of 1, 2" in done.stderr
    done = run(job / "launch.sh", tmp_path, {}, *short)
    assert done.returncode == 0 and "ACTOR_GPUS defaults to 2 for this launch, not 4" in done.stderr
    assert "--actor.num_gpus_per_node 2 " in (tmp_path / "ray.log").read_text()


def test_a_micro_batch_that_divides_no_step_is_refused(tmp_path, capsys) -> None:
    spec = tmp_path / "m.ask"
    spec.write_text((SPECS / "siblings.ask").read_text().replace("kl = 0.0 }", "kl = 0.0; micro_batch = 4 }"))
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(tmp_path / "job")]) == 1
    err = capsys.readouterr().err
    assert "error[E604]: `micro_batch = 4` does not divide a step's 6 rollouts" in err
    assert not (tmp_path / "job").exists()


def test_max_len_fits_the_models_context(tmp_path, capsys) -> None:
    """A local model folder's config.json gives the context: the spec's budget above it is
    capped (as a local run caps each reply), `--max-len` above it is E609 naming both."""
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    spec = tmp_path / "t.ask"
    spec.write_text(f'model m = hf("{weights}") {{ max_tokens = 2000 }}\n'
                    'role a { model = m; trained }\n'
                    'game g for i in range(0, 4) {\n'
                    '    x = ask a using "go"\n'
                    '    reward a = len(x.text)\n'
                    '}\n'
                    'train a with grpo { group = 2; steps = 1 }\n')
    job = compile_to(tmp_path, spec)
    args = parse_train_ppo_ray(train_flags(launch_argv(job / "launch.sh", tmp_path)[0]))
    assert args.data.max_len == 4096  # 2000 + 4096 of prompt room, capped at the context
    assert "max_len is the model's context, 4096 tokens" in (job / "README.md").read_text()
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(tmp_path / "j2"), "--max-len", "5000"]) == 1
    err = capsys.readouterr().err
    assert "error[E609]: --max-len 5000 exceeds the context of model 'm'" in err and "4096 tokens" in err
    job = compile_to(tmp_path, spec, "--max-len", "3000")
    args = parse_train_ppo_ray(train_flags(launch_argv(job / "launch.sh", tmp_path)[0]))
    assert args.data.max_len == 3000


def _record(runs: Path, phase: Path, skip: int | None) -> None:
    """One session per rollout of the phase's prompts, as the agent records them, but the
    `skip`-th prompt's (a node whose ASKSPEC_RUNS is not shared: they never arrive)."""
    from askspec.runtime.store.writer import RunWriter

    job = json.loads((phase / "job.json").read_text())
    writer = RunWriter.create(str(runs), experiment="t", experiment_hash="h", ir_json="{}", spec_files={}, seed=0,
                              roles={}, params={}, planned_sessions=0, argv=["stub"])
    k = 0
    for n, line in enumerate((phase / "prompts.jsonl").read_text().splitlines()):
        label = json.loads(json.loads(line)["label"])
        for _ in range(job["group"] if n != skip else 0):
            attempt = writer.session_started(f"s{k:06d}", game=label["game"], group_id=None, params=label["bindings"],
                                             index=k)
            writer.session_finished(f"s{k:06d}", attempt, status="ok", outcome=None, error=None, vars={},
                                    bookkeeping={"pushes": [["seen", {"x": label["bindings"]["x"]}]]})
            k += 1
    writer.close()


def test_commit_refuses_a_phase_whose_sessions_are_missing(tmp_path) -> None:
    job = compile_to(tmp_path, SPECS / "buffer_alternating.ask")
    phase = job / "phase-1-filler"
    assert phase_data.prompts(job, phase, 1) == 1
    _record(job / "runs" / "lost", phase, skip=0)
    with pytest.raises(phase_data.PhaseDataError, match=r"lack sessions of 1 of the phase's prompts \(fill #0 "
                                                        r"\{\"x\": 1\} \(0 of 2 sessions\)\)"):
        phase_data.commit(job, phase, job / "runs" / "lost", "iter-1-filler", 1)
    assert not (job / phase_data.STATE).exists()  # nothing committed
    _record(job / "runs" / "all", phase, skip=None)
    events = phase_data.commit(job, phase, job / "runs" / "all", "iter-1-filler", 1)
    assert [e["event"] for e in events] == ["push", "push"]


GRADED = """
model m = hf("smollm2-135m-instruct") { max_tokens = 32 }
model g = hf("smollm2-135m-instruct") { max_tokens = 8 }
role s { model = m; trained; memory = none; reply = boxed }
role grader { model = g }
data test_qs = [{q: "What is 1 + 2?", a: "3"}]
game practice for x in [1, 2] sample 2 {
    a = ask s using "Solve {{ x }}."
    reward s = 1.0
}
game test for item in test_qs {
    a = ask s: item.q
    verdict = ask grader using "Is {{ a.answer }} the answer to {{ item.q }}?"
    correct = equiv(a.answer, item.a)
    reward s = case { correct -> 1.0; else -> 0.0 }
}
train s with grpo { group = 2 }
stage rl train
stage heldout evaluate { games = [test]; score = correct }
"""


def test_an_evaluate_stage_serves_its_frozen_models(tmp_path, capsys) -> None:
    """An evaluate stage whose game asks a frozen role on an hf model (AskBench's judge) is
    part of the job (no W601): its serve_frozen.sh serves the evaluated weights and the
    frozen model, each on a server of its own, and `askspec run --endpoint` (parsed by
    askspec's own parser, bound by its own resolver) asks each role on its server."""
    from askspec.cli import build_parser
    from askspec.ir import model as ir
    from askspec.runtime.commands.options import RunOptions
    from askspec.runtime.commands.resolver import ModelResolver

    spec = tmp_path / "graded.ask"
    spec.write_text(GRADED)
    job = compile_to(tmp_path, spec)
    assert "W601" not in capsys.readouterr().err
    stage = job / "stage-2-heldout"
    calls = launch_argv(stage / "evaluate.sh", tmp_path)
    served = [(c[c.index("--port") + 1], c[2]) for c in calls if c[0] == "vllm"]
    # the trained weights (no CKPT_S given: the initial ones), then the initial; the grader's beside each
    # (the two servers of one evaluation start together, in the background: either may log first)
    pair = [("8001", "HuggingFaceTB/SmolLM2-135M-Instruct"), ("8002", "HuggingFaceTB/SmolLM2-135M-Instruct")]
    assert len(served) == 4 and sorted(served[:2]) == pair and sorted(served[2:]) == pair, served
    runs = [c[1:] for c in calls if c[0] == "askspec"]
    assert len(runs) == 2
    exp = ir.Experiment.model_validate(json.loads((job / "job.json").read_text())["experiment"])
    for run_argv in runs:
        opts = RunOptions.from_args(build_parser().parse_args(run_argv))
        resolver = ModelResolver(exp, opts, str(stage / "spec"))
        grader, policy = resolver.resolve("grader", "g"), resolver.resolve("s", "m")
        assert (grader.backend.endpoint, grader.weights) == ("http://127.0.0.1:8002/v1", "smollm2-135m-instruct")
        assert (policy.backend.endpoint, policy.weights) == ("http://127.0.0.1:8001/v1", "askspec-s")


def test_the_readme_lists_a_steps_batch_against_a_local_steps(tmp_path) -> None:
    """A block without `batch`: a local step is one group, a step of the job up to 16
    prompts' groups; the job's README says so, with the setting that makes them equal, and
    `ppo` is the local trainer's algorithm (grpo advantages, the PPO loss), not gae."""
    spec = tmp_path / "t.ask"
    spec.write_text('model m = hf("smollm2-135m-instruct") { max_tokens = 32 }\n'
                    'role a { model = m; trained }\n'
                    'game g for x in [1, 2, 3, 4] sample 2 {\n'
                    '    r = ask a using "Say {{ x }}."\n'
                    '    reward a = 1.0\n'
                    '}\n'
                    'train a with ppo { lr = 0.000001 }\n')
    job = compile_to(tmp_path, spec)
    readme = (job / "README.md").read_text()
    assert ("a step of this job trains on 4 prompt(s) x 2 rollouts = 8 (--rollout.batch_size x "
            "--rollout.n_samples_per_prompt = --train.batch_size), where a local step trains on 1 x 2 = 2") in readme
    assert "set `batch = 8` for the same step on both" in readme
    args = parse_train_ppo_ray(train_flags(launch_argv(job / "launch.sh", tmp_path)[0]))
    assert (args.algo.advantage.estimator, args.actor.policy_loss_type) == ("group_norm", "ppo")
    assert json.loads((job / "job.json").read_text())["extension"]["advantages"] == {"estimator": "grpo",
                                                                                       "std": "sample"}
    spec.write_text(spec.read_text().replace("lr = 0.000001", "lr = 0.000001; batch = 8"))
    job = compile_to(tmp_path, spec)
    assert "= 8 (--rollout.batch_size x --rollout.n_samples_per_prompt = --train.batch_size), as a local step " \
           "does" in (job / "README.md").read_text()


@pytest.mark.parametrize("case", ["one_exits", "none_answers"])
def test_serve_frozen_stops_when_a_server_cannot_answer(tmp_path, case) -> None:
    """Two servers, neither answering: one exits while the other still loads (it is watched,
    though the first is not up), or both keep loading past FROZEN_TIMEOUT: serve_frozen.sh
    stops (exit 1) with the end of that server's log, and stops the other."""
    spec = tmp_path / "graded.ask"
    spec.write_text(GRADED)
    stage = compile_to(tmp_path, spec) / "stage-2-heldout"
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "curl").write_text("#!/usr/bin/env bash\nexit 7\n")  # nothing answers
    exits = case == "one_exits"
    (stubs / "vllm").write_text('#!/usr/bin/env bash\necho "loading $2"\n'  # $2: the weights
                                f'if {"true" if exits else "false"} && [ "${{@: -1}}" = 8002 ]; then exit 3; fi\n'
                                'exec sleep 600\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "FROZEN_TIMEOUT": "1" if not exits else "600"}
    done = subprocess.run(["bash", str(stage / "serve_frozen.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    port, why = ("8002", "exited before it answered") if exits else ("8001", "did not answer within FROZEN_TIMEOUT=1 seconds")
    assert f"the vLLM server on port {port} {why}; the end of logs/vllm-{port}.log:" in done.stderr
    assert "loading" in done.stderr and not (stage / "logs" / "frozen.pids").exists()  # the others stopped


def test_endpoint_takes_a_server_url_of_openai_models() -> None:
    from askspec.runtime.commands.options import RunOptions, UsageError

    opts = RunOptions.from_kwargs("x.ask", endpoint=["judge=http://h:8002/v1/"], backend="openai")
    assert opts.endpoints == {"judge": "http://h:8002/v1"} and opts.recorded()["endpoints"] == opts.endpoints
    with pytest.raises(UsageError, match="--endpoint judge=h:8002: an http:// or https:// URL"):
        RunOptions.from_kwargs("x.ask", endpoint=["judge=h:8002"])
    with pytest.raises(UsageError, match="without another --backend"):
        RunOptions.from_kwargs("x.ask", endpoint=["judge=http://h:8002/v1"], backend="hf")
