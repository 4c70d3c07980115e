"""The multi-policy job (issue #36): a schedule that updates several roles in one step
compiles to one Ray job (multi.py, askspec_ext/multi_policy.py), and its step loop, run on
CPU under a real local Ray with each role's OpenRLHF actors stood in by the local trainer's
policy (multi_standin.py: the part that needs a GPU), equals `askspec run` of the same
spec and seed: per-role train_steps (rewards, gates, skips), buffer events, and the final
weights of each role."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from askspec.cli import main
from askspec.runtime.commands.resolver import local_resolver
from askspec.runtime.store.views import open_store
from askspec.runtime.targets.openrlhf.askspec_ext import multi_policy
from tests.targets.openrlhf_harness import parse_train_ppo_ray

pytestmark = pytest.mark.multicore  # a local Ray: each role's actors beside the driver

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
EVENT_FIELDS = "step, event, item, value, reason"
STEP_FIELDS = ("trajectories", "reward_mean", "reward_std", "gate", "skipped", "tokens", "sessions", "loss")

# a co-trained spec not in the repository: two roles updated every step, only the critic gated
CO_TRAINED = '''
experiment cotrained { seed = 3 }
model base = hf("TINY") { temperature = 1.0; max_tokens = 5; prefix_cache = false }
role writer { model = base; trained; memory = none }
role critic { model = base; trained; memory = none }
game duel for topic in ["sea", "sky"] {
    drafts = sample 2 ask writer using "Write about {{ topic }}"
    long = 0
    for d in drafts {
        reward d as writer = len(d.text) / 10
        verdicts = sample 2 ask critic: d.text
        for v in verdicts {
            reward v as critic = len(v.text) / 10
        }
        if len(d.text) > 8 {
            long = long + 1
        }
    }
}
train writer with grpo { lr = 0.01; kl = 0.0; save_every = 1 }
train critic with grpo { lr = 0.01; kl = 0.0; save_every = 1; update_when = sum(long) > 100 }
schedule online { steps = 2; games = [duel] }
'''


@pytest.fixture(scope="module")
def ray_local():
    import ray

    path = os.pathsep.join([str(ROOT), str(HERE)])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def paso(tiny_model, tmp_path_factory) -> tuple[Path, Path]:
    """PasoDoble online in small: (the spec, its local run)."""
    tmp = tmp_path_factory.mktemp("paso")
    spec = _spec(tmp, (HERE / "specs" / "pasodoble_online.ask").read_text(), tiny_model, "paso")
    return spec, _local(spec, tmp)


def _local(spec: Path, tmp: Path) -> Path:
    local = tmp / "local"
    assert main(["run", str(spec), "--out", str(local), "--quiet"]) == 0
    (run,) = [p for p in local.iterdir() if p.is_dir()]
    return run


def _spec(tmp: Path, text: str, tiny_model: Path, name: str) -> Path:
    path = tmp / f"{name}.ask"
    path.write_text(text.replace('hf("smollm2-135m-instruct")', f'hf("{tiny_model}")')
                    .replace('hf("TINY")', f'hf("{tiny_model}")'))
    return path


def _job(spec: Path, tmp: Path) -> Path:
    """`spec` compiled, and its step loop run (the run store under tmp/runs)."""
    from tests.targets.multi_standin import make_role

    job = tmp / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(job)]) == 0
    multi_policy.run(job, str(tmp / "runs"), make_role, local_resolver)
    return job


def _steps(con) -> list[tuple]:
    rows = con.execute("SELECT step, role, metrics FROM train_steps ORDER BY step, role").fetchall()
    return [(s, r, {k: json.loads(m).get(k) for k in STEP_FIELDS}) for s, r, m in rows]


def _same_weights(a: Path, b: Path) -> None:
    from safetensors.torch import load_file

    mine, theirs = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert mine.keys() == theirs.keys()
    for k in theirs:
        assert mine[k].equal(theirs[k]), (a, k)


def _equal_runs(run: Path, job: Path, runs: Path, roles: list[str], steps: int) -> list[tuple]:
    want, got = open_store(run), open_store(runs)
    local_steps = _steps(want)
    assert _steps(got) == local_steps
    assert [(s, r) for s, r, _ in local_steps] == [(s, r) for s in range(1, steps + 1) for r in sorted(roles)]
    assert got.execute(f"SELECT {EVENT_FIELDS} FROM buffer_events ORDER BY step, seq").fetchall() == \
        want.execute(f"SELECT {EVENT_FIELDS} FROM buffer_events ORDER BY step, seq").fetchall()
    rewards = "SELECT role, value FROM rewards ORDER BY session_id, role, turn_index, value"
    assert got.execute(rewards).fetchall() == want.execute(rewards).fetchall()
    for role in roles:
        _same_weights(job / "ckpt" / "checkpoints" / role / f"step-{steps}",
                      run / "checkpoints" / role / f"step-{steps}")
    latest = json.loads((job / "ckpt" / "checkpoints" / "latest.json").read_text())
    assert latest["step"] == steps and sorted(latest["roles"]) == sorted(roles)
    return local_steps


def test_pasodoble_online_job_equals_the_local_run(ray_local, paso, tmp_path) -> None:
    spec, run = paso
    job = _job(spec, tmp_path)
    steps = _equal_runs(run, job, tmp_path / "runs", ["proposer", "solver"], 2)
    assert any(m["skipped"] is None for _, _, m in steps), "some step must update"
    events = open_store(tmp_path / "runs").execute("SELECT count(*) FROM buffer_events WHERE event = 'push'").fetchone()
    assert events[0] > 0
    # the lockstep: each role's update time and its wait for the slower role, per step
    rows = open_store(tmp_path / "runs").execute(
        "SELECT step, role, metrics->>'lockstep_seconds', metrics->>'lockstep_wait_s' FROM train_steps "
        "WHERE skipped IS NULL ORDER BY step, role").fetchall()
    assert rows and all(float(s) > 0 and float(w) >= 0 for _, _, s, w in rows)
    print("lockstep (step, role, update s, wait s):", rows)


@pytest.mark.slow  # two launches of the job (~30 s on the 2-core machine)
def test_a_job_lost_while_checkpointing_resumes_from_the_last_step_every_role_saved(ray_local, paso, tmp_path) -> None:
    """The solver's save of step 2 fails after the proposer's: step 1 is the last step every
    role checkpointed (latest.json), so the next launch plays step 2 again from it (weights,
    AdamW, buffers) and ends where the local run ends."""
    from tests.targets.multi_standin import make_role

    spec, run = paso
    job = tmp_path / "job"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(job)]) == 0
    with pytest.raises(Exception, match="lost while saving step 2"):
        multi_policy.run(job, str(tmp_path / "runs1"),
                         lambda t, cfg, init: make_role(t, cfg, init, fail_save={"solver": 2}), local_resolver)
    ckpt = job / "ckpt" / "checkpoints"
    assert (ckpt / "proposer" / "step-2").is_dir() and not (ckpt / "solver" / "step-2").exists()
    assert json.loads((ckpt / "latest.json").read_text())["step"] == 1
    multi_policy.run(job, str(tmp_path / "runs2"), make_role, local_resolver)
    # the relaunch played step 2 alone (its train_steps of step 1 are the checkpoint's record of it)
    assert open_store(tmp_path / "runs2").execute("SELECT count(*) FROM sessions").fetchone()[0] == 1
    for role in ("proposer", "solver"):
        _same_weights(ckpt / role / "step-2", run / "checkpoints" / role / "step-2")


def test_a_step_without_tokens_steps_every_actors_schedule_through_ray(ray_local) -> None:
    """A `no_tokens` skip counts in the learning-rate schedule on OpenRLHF too (gate.py's
    `advance_lr_schedule`, which both the single- and the multi-policy job call): through
    OpenRLHF 0.11.2's own `RayActorGroup.async_run_method` and Ray's `__ray_call__`, on
    a real Ray actor that holds a torch scheduler as PolicyModelActor holds its own."""
    import ray
    import torch

    from askspec.runtime.targets.openrlhf.askspec_ext.gate import advance_lr_schedule
    from openrlhf_harness import _function

    @ray.remote(num_cpus=0)
    class Actor:
        def __init__(self) -> None:
            self.optim = torch.optim.AdamW(torch.nn.Linear(2, 1).parameters(), lr=0.1)
            self.actor_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optim, lambda k: 1.0 / (k + 1))

        def state(self) -> tuple[int, float, dict]:
            return self.actor_scheduler.last_epoch, self.optim.param_groups[0]["lr"], self.optim.state_dict()["state"]

    group = SimpleNamespace(_actor_handlers=[Actor.remote()])  # OpenRLHF's loop over its actors; one here
    group.async_run_method = _function("trainer/ray/launcher.py", "async_run_method", "RayActorGroup").__get__(group)
    assert advance_lr_schedule(group, ray) == pytest.approx(0.05)
    assert advance_lr_schedule(group, ray) == pytest.approx(0.1 / 3)
    for handle in group._actor_handlers:
        epoch, lr, moments = ray.get(handle.state.remote())
        assert (epoch, moments) == (2, {}) and lr == pytest.approx(0.1 / 3)  # the schedule only: no AdamW step


def test_the_actor_groups_init_gives_policy_actors_askspecs_schedule_through_ray(ray_local) -> None:
    """askspec_ext/schedule.py's driver hook on OpenRLHF 0.11.2's own `RayActorGroup`
    methods and real Ray actors: the policy group's init queues `apply_to_actor` behind each
    actor's own init (the actor's checkpoint loaded there: a later phase's scheduler step),
    so the refs `train()` waits for end with askspec's rate set for the step about to run;
    the reference model's group is left alone. The multi-policy job's roles take the same
    call (`OpenRLHFRole`)."""
    import ray
    import torch

    from askspec.runtime.targets.openrlhf.askspec_ext import schedule
    from askspec.runtime.train.config import lr_multiplier
    from openrlhf_harness import _function

    plan = {"steps": 6, "warmup": 0, "decay": "cosine", "floor": 0.1}

    @ray.remote(num_cpus=0)
    class Policy:  # holds a scheduler as PolicyModelActor does (OpenRLHF's: over this launch's 2 steps)
        def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
            self.strategy = strategy
            self.optim = torch.optim.AdamW(torch.nn.Linear(2, 1).parameters(), lr=0.1)
            self.actor_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optim, lambda k: max(0.0, 1 - k / max_steps))
            for _ in range(2):  # the role's previous phase, as its checkpoint restores it
                self.actor_scheduler.step()

        def rate(self) -> tuple[int, float]:
            return self.actor_scheduler.last_epoch, self.optim.param_groups[0]["lr"]

    @ray.remote(num_cpus=0)
    class Reference:
        def init_model_from_pretrained(self, strategy, pretrain):
            self.ready = True

    class Group:  # OpenRLHF's RayActorGroup: its own methods, over actors made here
        async_init_model_from_pretrained = _function("trainer/ray/launcher.py", "async_init_model_from_pretrained",
                                                     "RayActorGroup")
        async_run_method = _function("trainer/ray/launcher.py", "async_run_method", "RayActorGroup")

        def __init__(self, actor_type, n: int) -> None:
            self.ray_actor_type, self._actor_handlers = actor_type, [actor_type.remote() for _ in range(n)]

    launcher = SimpleNamespace(RayActorGroup=Group)
    schedule.install(launcher, SimpleNamespace(PolicyModelActor=Policy), plan)
    strategy = SimpleNamespace(args=SimpleNamespace(train=SimpleNamespace(max_epochs=1)))
    policy, reference = Group(Policy, 2), Group(Reference, 1)
    refs = policy.async_init_model_from_pretrained(strategy, "w", 2, None)
    assert len(refs) == 4  # each actor's init, then its schedule
    expected = 0.1 * lr_multiplier(2, steps=6, warmup=0, decay="cosine", floor=0.1)
    assert ray.get(refs)[2:] == [pytest.approx(expected)] * 2
    for handle in policy._actor_handlers:
        assert ray.get(handle.rate.remote()) == (2, pytest.approx(expected))
    assert len(reference.async_init_model_from_pretrained(strategy, "w")) == 1


def test_rollouts_become_openrlhf_groups_with_askspecs_advantages(monkeypatch) -> None:
    """A step's trajectories as OpenRLHF Experiences (SamplesGenerator's own conversion): each
    group of the local batch n rollouts (a group a `drop` shortened padded with rollouts that
    train no token), and askspec's advantages hook over them gives each kept rollout the
    local trainer's advantage."""
    import ast
    import types

    import torch

    from askspec.runtime.targets.openrlhf.askspec_ext import advantages
    from askspec.runtime.train.advantages import advantages as local_advantages
    from askspec.runtime.train.batch import Trajectory, Turn
    from openrlhf.trainer.ppo_utils.experience import Experience
    from tests.targets.openrlhf_harness import OPENRLHF

    # samples_generator.py imports vLLM at module top: its own method, extracted from the source
    tree = ast.parse((OPENRLHF / "trainer/ppo_utils/samples_generator.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SamplesGenerator")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_process_response_into_experience")
    scope: dict = {"torch": torch, "Experience": Experience}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "samples_generator.py", "exec"), scope)
    module = types.ModuleType("openrlhf.trainer.ppo_utils.samples_generator")
    module.SamplesGenerator = type("SamplesGenerator", (), {fn.name: scope[fn.name]})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def traj(key: str, group: str, reward: float, n_tokens: int) -> Trajectory:
        turn = Turn("s", 1, 0, [1, 2, 3], list(range(10, 10 + n_tokens)), [0.0] * n_tokens, 1.0, "stop")
        return Trajectory(key=key, group_key=group, reward=reward, turns=[turn])

    # question a: 3 answers kept; question b: one of 3 dropped (2 kept)
    trajs = [traj("a0", "a", 1.0, 2), traj("a1", "a", 0.0, 3), traj("a2", "a", 1.0, 1),
             traj("b0", "b", 0.0, 2), traj("b1", "b", 1.0, 4)]
    exps = multi_policy.experiences(trajs, 3, 64)
    assert len(exps) == 6
    for i, e in enumerate(exps):
        e.index = [i]  # as RemoteExperienceMaker.split_rollout_samples numbers them
    got = advantages.askspec_advantages(exps, 3, "grpo", "sample")
    want = local_advantages("grpo", torch.tensor([t.reward for t in trajs], dtype=torch.float64),
                            torch.tensor([0, 0, 0, 1, 1]), torch.tensor([float(t.tokens) for t in trajs]), "sample")
    assert [got[i] for i in (0, 1, 2, 3, 4)] == pytest.approx(want.tolist())
    assert got[5] == 0.0 and int(exps[5].action_mask.sum()) == 0  # the padding trains nothing
    assert int(exps[1].action_mask.sum()) == 3  # a rollout's loss tokens are its completion's
    # a step padded to its batch (one optimizer step): whole groups that train nothing, the advantages unchanged
    padded = multi_policy.experiences(trajs, 3, 64, total=12)
    assert len(padded) == 12 and all(int(e.action_mask.sum()) == 0 for e in padded[6:])
    for i, e in enumerate(padded):
        e.index = [i]
    assert advantages.askspec_advantages(padded, 3, "grpo", "sample") == {**got, **{i: 0.0 for i in range(6, 12)}}


def test_a_co_trained_spec_with_one_gated_role(ray_local, tiny_model, tmp_path) -> None:
    spec = _spec(tmp_path, CO_TRAINED, tiny_model, "cotrained")
    run, job = _local(spec, tmp_path), _job(spec, tmp_path)
    steps = _equal_runs(run, job, tmp_path / "runs", ["critic", "writer"], 2)
    assert [m["skipped"] for _, r, m in steps if r == "critic"] == ["gate", "gate"]
    assert [m["skipped"] for _, r, m in steps if r == "writer"] == [None, None]


def test_pasodoble_online_compiles_to_one_job_whose_launch_lines_parse(tiny_model, tmp_path) -> None:
    job = tmp_path / "job"
    assert main(["compile", str(ROOT / "specs" / "pasodoble.ask"), "--target", "openrlhf", "--profile", "online",
                 "-o", str(job)]) == 0
    top = json.loads((job / "job.json").read_text())
    assert top["kind"] == "multi_policy" and sorted(top["roles"]) == ["proposer", "solver"]
    assert (job / "askspec_ext" / "multi_policy.py").exists() and not (job / "driver.sh").exists()
    entry_point = (job / "askspec_multi.py").read_text()
    assert "multi_policy.main(sys.argv[1:], local_resolver)" in entry_point
    readme = (job / "README.md").read_text()
    assert "## Multi-policy job" in readme and "PolicyModelActor" in readme
    # launch.sh with `ray` on PATH as a recorder: its command line, split per role, parsed by OpenRLHF's parser
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "ray").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RAY_ARGV"\n')
    (stubs / "ray").chmod(0o755)
    (stubs / "python3").symlink_to(sys.executable)
    argv_file = tmp_path / "argv"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "RAY_ARGV": str(argv_file),
           "PROPOSER_GPUS": "2", "SOLVER_GPUS": "4"}
    done = subprocess.run(["bash", str(job / "launch.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    argv = argv_file.read_text().splitlines()
    entry = argv[argv.index("--") + 1:]
    assert entry[:3] == ["python3", "askspec_multi.py", "--job"] and (job / "askspec_multi.py").exists()
    # the sessions run in the entry point's one process (the local trainer's loop): one history, as locally
    runtime_env = json.loads(next(a for a in argv if a.startswith("--runtime-env-json=")).split("=", 1)[1])["env_vars"]
    assert "ASKSPEC_HISTORY" not in runtime_env
    job_dir, per_role = multi_policy.split_roles(entry[2:])
    assert sorted(per_role) == ["proposer", "solver"]
    from askspec.lang.compiler import compile_file
    from askspec.runtime.engine.plan import load_dataset
    from askspec.runtime.train import runner

    exp = compile_file(str(ROOT / "specs" / "pasodoble.ask"), {}, "online").ir
    datasets = {d.name: load_dataset(d, str(ROOT / "specs"), 0) for d in exp.datasets}
    trainer = runner.prepare(exp, params=exp.param_values(), datasets=datasets, seed=0, resolver=None, run_dir=None)
    # a step: one passage, its 6 proposals; 6 answers to each of up to 6 questions
    most = {"proposer": 6, "solver": 36}
    assert {r: multi_policy.rollouts_per_step(trainer, r) for r in most} == most
    for role, gpus in (("proposer", 2), ("solver", 4)):
        args = parse_train_ppo_ray(per_role[role])
        size = multi_policy.step_batch(args, most[role])
        # one optimizer step per askspec step: whole groups, whole DeepSpeed steps, every rollout of the step
        assert size >= most[role] and size % 6 == 0 and size % (args.train.micro_batch_size * gpus) == 0
        assert args.actor.num_gpus_per_node == gpus
        assert args.rollout.n_samples_per_prompt == 6  # I proposals; J answers per question
        assert args.data.prompt_dataset.endswith("prompts.jsonl")
        # the entry point's own parse (OpenRLHF's parser from its source) agrees
        assert vars(multi_policy.openrlhf_args(per_role[role]).actor) == vars(args.actor)
    # a bad resource value is refused as every generated script refuses one
    bad = subprocess.run(["bash", str(job / "launch.sh")], env={**env, "SOLVER_GPUS": "08"}, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "SOLVER_GPUS" in bad.stderr
    # 5 proposer GPUs: the compiled batch of 96 rollouts is no whole DeepSpeed step of 5, but the driver pads
    # each step to whole groups of 6 and whole steps of 5 (step_batch: 30 for the 6 rollouts a step holds),
    # so the launch checks the padded batch and goes on
    five = subprocess.run(["bash", str(job / "launch.sh")], env={**env, "PROPOSER_GPUS": "5"}, capture_output=True,
                          text=True, timeout=120)
    assert five.returncode == 0, five.stderr[-2000:]
    again = argv_file.read_text().splitlines()
    _, per_role = multi_policy.split_roles(again[again.index("--") + 3:])
    args = parse_train_ppo_ray(per_role["proposer"])
    assert args.actor.num_gpus_per_node == 5 and multi_policy.step_batch(args, most["proposer"]) == 30
    from askspec.runtime.targets.openrlhf import world

    assert world.problem(world.settings(per_role["proposer"])) is not None  # what the check refused unpadded
    assert world.main(["--given", "--padded", "--", *per_role["proposer"]]) == 0


def test_the_driver_is_pinned_to_the_openrlhf_it_mirrors(monkeypatch, tmp_path) -> None:
    """The multi-policy driver mirrors train_ppo_ray's `train` and calls OpenRLHF's actors by
    signature: under another release, or a patched 0.11.2, it refuses before OpenRLHF's
    parser runs (nothing started), naming both versions and the way out for this job."""
    import importlib.metadata

    from askspec.runtime.targets.openrlhf.askspec_ext import pinned

    assert pinned.fingerprint(multi_policy.sources()) == multi_policy.FINGERPRINT  # the installed 0.11.2's code
    parsed: list = []
    monkeypatch.setattr(multi_policy, "openrlhf_args", lambda argv: parsed.append(argv))
    argv = ["--job", str(tmp_path), "--askspec.role", "proposer", "--train.seed", "0"]
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.12.0" if name == "openrlhf" else real(name))
    with pytest.raises(RuntimeError, match=r"multi-policy driver was written for OpenRLHF 0\.11\.2 .*openrlhf 0\.12\.0 "
                                           r"is installed.*one job per trained role"):
        multi_policy.main(argv, local_resolver)
    monkeypatch.setattr(importlib.metadata, "version", real)
    monkeypatch.setattr(multi_policy, "sources", lambda: ["def train(args): pass"])
    with pytest.raises(RuntimeError, match=r"differs from the released 0\.11\.2's"):
        multi_policy.main(argv, local_resolver)
    assert parsed == []
