"""Every flag of every generated launch script is accepted by OpenRLHF 0.11.2's own
argument parser and its own validation (train_ppo_ray's main block, run on CPU), and the
values are the ones the spec implies; the phase driver chains checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from askspec.cli import main

from openrlhf_harness import launch_argv, parse_train_ppo_ray, parse_train_sft, sft_flags, train_flags

ROOT = Path(__file__).resolve().parents[2]
ALTERNATING = Path(__file__).parent / "specs" / "alternating.ask"

# spec, compile options, expected (estimator, loss, samples per prompt, clip low/high); Reasoning
# Arena's Eq. 2 population std is the job's askspec_ext (advantages.py), with any loss
JOBS = [
    ("askbench.ask", [], ("group_norm", "ppo", 8, (0.2, 0.2))),
    ("ask_e.ask", ["--profile", "training"], ("group_norm", "cispo", 16, (0.75, 3.0))),
    ("ask_e.ask", ["--profile", "training", "--substitute", "cispo=grpo"], ("group_norm", "ppo", 16, (0.75, 3.0))),
    # App. E's asynchronous rollouts are Ask-E's default (CISPO with the extension's truncated
    # importance weight); staleness 0 trains synchronously
    ("ask_e.ask", ["--profile", "training", "--set", "staleness=0"], ("group_norm", "cispo", 16, (0.75, 3.0))),
    ("reasoning_arena.ask", [], ("group_norm", "cispo", 8, (1.0, 2.0))),
    ("reasoning_arena.ask", ["--profile", "cpu"], ("group_norm", "cispo", 4, (1.0, 2.0))),
    ("reasoning_arena.ask", ["--set", "advantage_std=sample"], ("group_norm", "cispo", 8, (1.0, 2.0))),
    ("reasoning_arena.ask", ["--substitute", "cispo=grpo"], ("group_norm", "ppo", 8, (1.0, 2.0))),
    ("reasoning_arena.ask", ["--substitute", "cispo=grpo", "--set", "advantage_std=sample"], ("group_norm", "ppo", 8, (1.0, 2.0))),
    ("reasoning_arena.ask", ["--substitute", "cispo=gspo", "--set", "group_size=4", "--set", "advantage_std=sample"], ("group_norm", "gspo", 4, (1.0, 2.0))),
    ("askbench.ask", ["--set", "rollouts=2"], ("group_norm", "ppo", 2, (0.2, 0.2))),
    # an outer session's 4 datasets x 64 questions are one prompt's rollouts (grounded: through the
    # job's askspec_nested.py, which starts the inner-loop service)
    ("soar.ask", [], ("rloo", "ppo", 256, (0.2, 0.2))),
    ("soar.ask", ["--profile", "intrinsic_t"], ("rloo", "ppo", 256, (0.2, 0.2))),
]


def compile_to(tmp_path: Path, spec: Path, options: list[str]) -> Path:
    out = tmp_path / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(out), *options]) == 0
    return out


@pytest.mark.parametrize("spec,options,want", JOBS, ids=[f"{s}{' '.join(o)}" for s, o, _ in JOBS])
def test_launch_script_parses_with_openrlhf(tmp_path, job_extension, spec, options, want) -> None:
    job = compile_to(tmp_path, ROOT / "specs" / spec, options)
    calls = launch_argv(job / "launch.sh", tmp_path, {"ACTOR_GPUS": "8", "VLLM_ENGINES": "4"})
    (call,) = calls
    assert call[:3] == ["ray", "job", "submit"]
    estimator, loss, n, clip = want
    entry = call[call.index("--") + 3]
    # every RL job whose estimator is not gae starts OpenRLHF through the extension it ships
    # (job.json's `extension`: askspec's advantages, and the CISPO loss, which adds the choice);
    # a nested job's askspec_nested.py starts that entry in turn
    ext = json.loads((job / "job.json").read_text()).get("extension") or {}
    assert ext["advantages"] == {"estimator": {"group_norm": "grpo"}.get(estimator, estimator),
                                 "std": "sample" if spec != "reasoning_arena.ask" or "advantage_std=sample" in options
                                 else "population"}
    assert (job / "askspec_ext").is_dir()
    assert (loss == "cispo") == ("policy_loss" in ext)
    if spec == "reasoning_arena.ask":  # Eq. 2's std unless the compile sets the sample std
        assert ext.get("advantage_std") == (None if "advantage_std=sample" in options else "population")
    nested = "inner_loop" in json.loads((job / "job.json").read_text())
    assert (entry == "askspec_nested") == nested == (job / "askspec_nested.py").exists()
    if nested:
        assert "local_resolver, 'askspec_ext.train_ppo_ray')" in (job / "askspec_nested.py").read_text()
    else:
        assert entry == "askspec_ext.train_ppo_ray"
    if nested:  # the service's state folder reaches the job's processes
        env = json.loads(next(a.split("=", 1)[1] for a in call if a.startswith("--runtime-env-json=")))
        assert env["env_vars"]["ASKSPEC_INNER_STATE"] == str(job / "ckpt" / "inner-loop")
        assert env["env_vars"]["ASKSPEC_INNER_TIMEOUT"] == "86400"
    if loss == "cispo":
        cispo, _ = job_extension(job)
        with cispo.parser_accepts_cispo():
            args = parse_train_ppo_ray(train_flags(call))
    else:
        args = parse_train_ppo_ray(train_flags(call))
    assert args.algo.advantage.estimator == estimator
    assert args.actor.policy_loss_type == loss
    assert args.rollout.n_samples_per_prompt == n == args.eval.n_samples_per_prompt
    assert tuple(args.actor.eps_clip_low_high) == clip
    # max_staleness = 1: OpenRLHF's async trainer, the cispo extension's token-level TIS
    # truncated at is_bound (2); else OpenRLHF's defaults (synchronous, no correction)
    staleness = "staleness=1" in options or (spec == "ask_e.ask" and "staleness=0" not in options)
    want_async = (True, 1, "token", "clip", [0.0, 2.0]) if staleness else (False, 1, "off", "mask", [0.5, 5.0])
    assert (args.train.async_enable, args.train.async_queue_size, args.algo.advantage.is_correction_level,
            args.algo.advantage.is_correction_mode, list(args.algo.advantage.is_correction_threshold)) == want_async
    assert args.train.agent_func_path == "agent.py" and args.reward.remote_url == ["agent"]
    assert args.data.prompt_dataset == "prompts.jsonl" and args.data.label_key == "label"
    assert args.actor.num_gpus_per_node == 8 and args.vllm.num_engines == 4
    assert args.train.batch_size == args.rollout.batch_size * n  # one optimizer step per rollout batch
    assert tuple(args.reward.clip_range) == (-1e9, 1e9)  # rewards reach the trainer unclipped
    assert (job / args.train.agent_func_path).exists() and (job / args.data.prompt_dataset).exists()


def test_settings_reach_their_flags(tmp_path) -> None:
    job = compile_to(tmp_path, ROOT / "specs" / "reasoning_arena.ask", ["--substitute", "cispo=grpo",
                                                                          "--set", "advantage_std=sample"])
    args = parse_train_ppo_ray(train_flags(launch_argv(job / "launch.sh", tmp_path)[0]))
    assert args.actor.adam.lr == pytest.approx(4e-7)
    # OpenRLHF's warm-up ratio is of all its steps: passes x steps per pass over the prompts
    prompts = len((job / args.data.prompt_dataset).read_text().splitlines())
    steps = args.train.num_episodes * (prompts // args.rollout.batch_size)
    assert steps == 1500 and args.actor.lr_warmup_ratio == pytest.approx(50 / steps)  # 50 warm-up of 1500 steps
    assert args.rollout.temperature == 1.0 and args.rollout.max_new_tokens == 81920  # the paper's policy budget
    assert args.algo.kl.init_coef == 0 and not args.algo.kl.use_loss
    assert args.train.seed == 0


def test_alternating_phases_chain_checkpoints(tmp_path) -> None:
    """Two trained roles: a driver runs phase jobs in order, each starting from the trained
    role's latest checkpoint while the other trained role is served from its own."""
    job = compile_to(tmp_path, ALTERNATING, [])
    calls = launch_argv(job / "driver.sh", tmp_path)
    rays = [c for c in calls if c[0] == "ray"]
    vllms = [c for c in calls if c[0] == "vllm"]
    assert len(rays) == 4  # 2 iterations x (proposer, solver)
    parsed = [parse_train_ppo_ray(train_flags(c)) for c in rays]
    base = "HuggingFaceTB/SmolLM2-135M-Instruct"
    ckpt = str(job / "ckpt")
    # every phase starts from the role's initial weights (its KL reference) and loads a copy of its previous
    # phase's DeepSpeed checkpoint, the state that carries (askspec_ext/carry.py)
    assert [a.actor.model_name_or_path for a in parsed] == [base] * 4
    assert all(a.ckpt.load_enable and a.ckpt.max_num == 1 for a in parsed)
    assert [a.ckpt.path for a in parsed] == [
        f"{ckpt}/iter-1/proposer-ds", f"{ckpt}/iter-1/solver-ds", f"{ckpt}/iter-2/proposer-ds", f"{ckpt}/iter-2/solver-ds"]
    assert [a.ckpt.output_dir for a in parsed] == [
        f"{ckpt}/iter-1/proposer", f"{ckpt}/iter-1/solver", f"{ckpt}/iter-2/proposer", f"{ckpt}/iter-2/solver"]
    # one diversity()/novelty() history for the whole job (named by its folder), each launch's lines its own
    envs = [json.loads(next(a for a in c if a.startswith("--runtime-env-json=")).split("=", 1)[1])["env_vars"]
            for c in rays]
    assert len({e["ASKSPEC_HISTORY"] for e in envs}) == 1 and len({e["ASKSPEC_LAUNCH"] for e in envs}) == 4
    # and each launch knows its iteration (the trainer numbers its steps as the local schedule does)
    assert [e["ASKSPEC_ITERATION"] for e in envs] == ["1", "1", "2", "2"]
    proposer, solver = parsed[0], parsed[1]
    assert (proposer.algo.advantage.estimator, proposer.actor.policy_loss_type) == ("rloo", "ppo")
    assert (solver.algo.advantage.estimator, solver.actor.policy_loss_type) == ("group_norm", "gspo")
    assert solver.algo.kl.init_coef == 0.01 and solver.algo.kl.use_loss and solver.algo.kl.estimator == "k3"
    assert tuple(solver.actor.eps_clip_low_high) == (0.3, 0.3)
    # the proposer phase serves the frozen solver from its latest checkpoint
    served = [c[2] for c in vllms]
    assert served == [base, f"{ckpt}/iter-1/solver"]
    # re-running resumes: every phase's checkpoint exists, nothing is submitted again
    again = launch_argv(job / "driver.sh", tmp_path)
    assert [c for c in again if c[0] == "ray"] == []


ONLINE = """
model m = hf("smollm2-135m-instruct") { max_tokens = 32 }
role p { model = m; trained }
game a for x in [1, 2, 3, 4] sample 2 {
    r = ask p using "Say {{ x }}."
    reward p = 1.0
}
game b for x in [5, 6] sample 2 {
    r = ask p using "Say {{ x }}."
    reward p = 0.0
}
train p with rloo { lr = 0.000001; batch = 4 }
schedule online { steps = 6; games = [a] }
"""


def test_online_schedule_chooses_games_and_steps(tmp_path) -> None:
    spec = tmp_path / "online.ask"
    spec.write_text(ONLINE)
    job = compile_to(tmp_path, spec, [])
    labels = [json.loads(json.loads(line)["label"]) for line in (job / "prompts.jsonl").read_text().splitlines()]
    # 4 elements, 2 per step (batch 4 / group 2): the 6 steps' 12 groups, each with its place in the local schedule
    assert [(x["game"], x["bindings"]["x"]) for x in labels] == [("a", x) for x in (1, 2, 3, 4) * 3]
    assert [(x["draw"]["step"], x["draw"]["at"], x["draw"]["epoch"]) for x in labels] == \
        [(s, j, (2 * (s - 1) + j) // 4) for s in range(1, 7) for j in range(2)]
    args = parse_train_ppo_ray(train_flags(launch_argv(job / "launch.sh", tmp_path)[0]))
    assert (args.rollout.batch_size, args.train.batch_size, args.train.num_episodes) == (2, 4, 1)
    assert args.algo.advantage.estimator == "rloo" and args.rollout.n_samples_per_prompt == 2


def test_steps_that_do_not_divide_the_elements_play_the_local_walk(tmp_path) -> None:
    """3 elements, 2 a step, 4 steps: OpenRLHF would train each pass's third element as a
    step of its own (8 steps of 1 or 2 prompts); the job's prompts are instead the 8
    elements the local trainer's planner gives its 4 steps, one pass of whole steps."""
    from askspec.ir import model as ir
    from askspec.runtime.train.trainer import LocalTrainer

    job = compile_to(tmp_path, Path(__file__).parent / "specs" / "uneven_steps.ask", [])
    labels = [json.loads(json.loads(line)["label"]) for line in (job / "prompts.jsonl").read_text().splitlines()]
    exp = ir.Experiment.model_validate(json.loads((job / "job.json").read_text())["experiment"])
    local = LocalTrainer(exp, params=exp.param_values(), datasets={}, seed=0, resolver=None, run_dir=None)
    want = []
    for sl in local.slots:
        plans = local.planners[sl.phase.name].plans(sl.n, local.index0[sl.step - 1], sl.step)
        want += [p.bindings for p in plans if p.group_id is None or p.session_id == min(
            q.session_id for q in plans if q.group_id == p.group_id)]  # one prompt a group
    assert [lb["bindings"] for lb in labels] == want == [{"x": x} for x in (1, 2, 3, 1, 2, 3, 1, 2)]
    args = parse_train_ppo_ray(train_flags(launch_argv(job / "launch.sh", tmp_path)[0]))
    assert len(labels) % args.rollout.batch_size == 0  # no partial step
    assert args.train.num_episodes * len(labels) // args.rollout.batch_size == 4 == len(local.slots)


def test_steps_that_are_not_whole_passes_play_the_local_walk(tmp_path) -> None:
    """4 elements, 2 a step, 3 steps: two passes would be 4 steps; the job's prompts are the
    6 elements the local steps take, one pass."""
    spec = tmp_path / "online.ask"
    spec.write_text(ONLINE.replace("steps = 6", "steps = 3"))
    job = compile_to(tmp_path, spec, [])
    labels = [json.loads(json.loads(line)["label"]) for line in (job / "prompts.jsonl").read_text().splitlines()]
    assert [x["bindings"]["x"] for x in labels] == [1, 2, 3, 4, 1, 2]
    args = parse_train_ppo_ray(train_flags(launch_argv(job / "launch.sh", tmp_path)[0]))
    assert (args.rollout.batch_size, args.train.num_episodes) == (2, 1)


def test_sibling_job_groups_the_sample_replies(tmp_path) -> None:
    """A `sample 3 ask` of the trained role: OpenRLHF's rollouts per prompt are its 3 replies,
    and the siblings' timeout reaches the agent through Ray's runtime environment."""
    job = compile_to(tmp_path, Path(__file__).parent / "specs" / "siblings.ask", [])
    (call,) = launch_argv(job / "launch.sh", tmp_path, {"ASKSPEC_GROUP_TIMEOUT": "90"})
    args = parse_train_ppo_ray(train_flags(call))
    assert args.rollout.n_samples_per_prompt == 3 == args.eval.n_samples_per_prompt
    assert args.algo.advantage.estimator == "group_norm"
    env = json.loads(next(a for a in call if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    assert env["env_vars"]["ASKSPEC_GROUP_TIMEOUT"] == "90"
    (default,) = launch_argv(job / "launch.sh", tmp_path)
    env = json.loads(next(a for a in default if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    assert env["env_vars"]["ASKSPEC_GROUP_TIMEOUT"] == "1800"
    # one diversity()/novelty() history for every agent of the phase, on the run store every node sees,
    # named by the job's folder (another job's, or another phase's, is another file)
    shared = Path(env["env_vars"]["ASKSPEC_HISTORY"])
    assert shared.parent == Path(env["env_vars"]["ASKSPEC_RUNS"]) / "history" and shared.suffix == ".ndjson"
    (again,) = launch_argv(job / "launch.sh", tmp_path, {"ASKSPEC_RUNS": str(tmp_path / "shared")})
    env = json.loads(next(a for a in again if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    assert Path(env["env_vars"]["ASKSPEC_HISTORY"]) == tmp_path / "shared" / "history" / shared.name
    other = compile_to(tmp_path / "other", Path(__file__).parent / "specs" / "siblings.ask", [])
    (call,) = launch_argv(other / "launch.sh", tmp_path)
    env = json.loads(next(a for a in call if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    assert Path(env["env_vars"]["ASKSPEC_HISTORY"]).name != shared.name


def test_max_len_holds_an_asks_own_larger_budget(tmp_path) -> None:
    """An ask's `with sampling { max_tokens }` above the role's budget (Ask-E's final turn)
    must fit in the job's max_len: the agent caps each call at what max_len leaves."""
    spec = tmp_path / "t.ask"
    spec.write_text('model m = hf("smollm2-135m-instruct") { max_tokens = 64 }\n'
                    'role a { model = m; memory = full; prompt = "go"; trained }\n'
                    'game g for i in range(0, 4) {\n'
                    '    x = ask a\n'
                    '    y = ask a with sampling { max_tokens = 1000 }\n'
                    '    reward a = len(y.text)\n'
                    '}\n'
                    'train a with grpo { group = 2; steps = 1 }\n')
    job = compile_to(tmp_path, spec, [])
    args = parse_train_ppo_ray(train_flags(launch_argv(job / "launch.sh", tmp_path)[0]))
    assert args.rollout.max_new_tokens == 64  # the role's own budget
    from askspec.runtime.targets.openrlhf.mapping import CONTEXT_ALLOWANCE

    assert args.data.max_len == 2 * 1000 + CONTEXT_ALLOWANCE  # two calls, each up to the larger budget


def test_pasodoble_phases_and_stages_parse_with_openrlhf(tmp_path) -> None:
    """PasoDoble offline: each phase's launch line and each sft stage's passes its program's
    own parser; the proposer's phase, whose train block has the update gate, starts OpenRLHF
    through the extension that evaluates it (askspec_ext/gate.py); the solver's is OpenRLHF's."""
    job = compile_to(tmp_path, ROOT / "specs" / "pasodoble.ask", [])
    phases = sorted(job.glob("phase-*"))
    assert [p.name for p in phases] == ["phase-1-proposer", "phase-2-solver"]
    for phase in phases:
        (call,) = launch_argv(phase / "launch.sh", tmp_path)
        args = parse_train_ppo_ray(train_flags(call))
        ext = json.loads((phase / "job.json").read_text()).get("extension") or {}
        gated = phase.name == "phase-1-proposer"
        # both phases compute askspec's grpo advantages and carry their role's state from its previous
        # phase (askspec_ext/carry.py); only the proposer's also gates its updates
        # and lay their learning-rate schedule over the role's whole schedule (askspec_ext/schedule.py)
        assert ext == {"advantages": {"estimator": "grpo", "std": "sample"}, "carry_state": True,
                       # (T_P = 10 proposer steps, T_S = 5 solver steps, 60 iterations)
                       "lr_schedule": {"steps": 600 if gated else 300, "warmup": 0, "decay": "constant", "floor": 0.0},
                       "prompt_order": "sequential", **({"update_gate": True} if gated else {})}
        assert call[call.index("--") + 3] == "askspec_ext.train_ppo_ray" and (phase / "askspec_ext").is_dir()
        assert args.algo.advantage.estimator == "group_norm" and args.actor.policy_loss_type == "ppo"
    for stage in sorted(job.glob("stage-*/sft.sh")):
        (call,) = launch_argv(stage, tmp_path)
        parse_train_sft(sft_flags(call))
