"""A buffer across an OpenRLHF job's phases (phase_data.py, driver.sh): the filler's phase
pushes, the learner's phase replays the buffer as it stands when the phase starts; the
buffer events, the phase order and a resume after a failed phase.

OpenRLHF's launch is a stand-in `ray` on PATH that plays each prompt of the phase as the
agent records it (one session per rollout in `$ASKSPEC_RUNS`, through the run store's
writer, pushes in the session's bookkeeping), last prompt first (OpenRLHF's data loader
shuffles them), and writes the checkpoint folder where OpenRLHF would
(`--ckpt.output_dir`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.runtime.targets.openrlhf import phase_data

from openrlhf_harness import launch_argv, parse_train_ppo_ray, train_flags

pytestmark = pytest.mark.multicore  # driver.sh's launches and phase_data calls beside it

SPECS = Path(__file__).parent / "specs"

RAY = '''#!{python}
import json, os, sys
from pathlib import Path

import pytest
from askspec.runtime.store.writer import RunWriter

argv = sys.argv[1:]
flag = lambda name: argv[argv.index(name) + 1]
phase = Path.cwd()
# the weights it starts from: the carried checkpoint's (driver.sh's --ckpt.load_enable: askspec_ext/carry.py
# has OpenRLHF load the role's previous phase's state from --ckpt.path/_actor), else --actor.model_name_or_path
carried = Path(flag("--ckpt.path")) / "_actor" / "from"
start = carried.read_text() if "--ckpt.load_enable" in argv and carried.exists() else flag("--actor.model_name_or_path")
with open(os.environ["LAUNCH_LOG"], "a") as f:
    f.write(json.dumps([phase.name, start, argv]) + "\\n")
job = json.loads((phase / "job.json").read_text())
writer = RunWriter.create(os.environ["ASKSPEC_RUNS"], experiment="t", experiment_hash="h", ir_json="{{}}",
                          spec_files={{}}, seed=0, roles={{}}, params={{}}, planned_sessions=0, argv=["stub"])
k = 0
for line in reversed((phase / "prompts.jsonl").read_text().splitlines()):  # OpenRLHF's loader shuffles
    label = json.loads(json.loads(line)["label"])
    for member in range(job["group"]):
        sid = f"s{{k:06d}}"
        attempt = writer.session_started(sid, game=label["game"], group_id=None, params=label["bindings"], index=k)
        if label["game"] == "fill":
            writer.session_finished(sid, attempt, status="ok", outcome=None, error=None, vars={{}},
                                    bookkeeping={{"pushes": [["seen", {{"x": label["bindings"]["x"]}}]]}})
        else:  # the replay's score: 1 for x = 2, else 0.5 (both members agree)
            acc = 1.0 if label["bindings"]["item"]["x"] == 2 else 0.5
            writer.session_finished(sid, attempt, status="ok", outcome=None, error=None, vars={{"acc": acc}})
        k += 1
writer.close()
launches = sum(1 for _ in open(os.environ["LAUNCH_LOG"]))
if os.environ.get("FAIL_AT") == str(launches):
    sys.exit(1)  # the job died after its rollouts: they must not reach the buffer
out = Path(flag("--ckpt.output_dir"))
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text("{{}}")
if "--ckpt.load_enable" in argv:  # the state saved at the phase's last step (carry.py)
    carried.parent.mkdir(parents=True, exist_ok=True)
    carried.write_text(str(out))
'''


def compile_job(tmp_path: Path, spec: str = "buffer_alternating.ask") -> Path:
    out = tmp_path / "job"
    assert main(["compile", str(SPECS / spec), "--target", "openrlhf", "-o", str(out)]) == 0
    for serve in out.glob("phase-*/serve_frozen.sh"):  # no frozen servers: the stand-in plays every role
        serve.write_text("#!/usr/bin/env bash\n")
    return out


def drive(job: Path, tmp_path: Path, fail_at: int | None = None) -> tuple[int, list[list[str]]]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "ray").write_text(RAY.format(python=sys.executable))
    (stubs / "ray").chmod(0o755)
    log = tmp_path / "launches.log"
    log.unlink(missing_ok=True)
    # two actor GPUs: OpenRLHF wants a step's 2 rollouts to cover its actor processes
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "LAUNCH_LOG": str(log), "ACTOR_GPUS": "2",
           "PHASE_DATA": f"{sys.executable} -m askspec.runtime.targets.openrlhf.phase_data"}
    if fail_at is not None:
        env["FAIL_AT"] = str(fail_at)
    done = subprocess.run(["bash", str(job / "driver.sh")], env=env, cwd=tmp_path, timeout=120,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    launches = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return done.returncode, launches


def phases(launches: list) -> list[list[str]]:
    """(phase folder, the weights it started from) of each launch."""
    return [launch[:2] for launch in launches]


def events(job: Path) -> list[tuple]:
    """(step, phase, event, item, score) of the job's buffer events, as a local run's
    buffer_events hold them (the local schedule's global step, its phase: the role)."""
    return [(e["step"], e["phase"], e["event"], e["item"], e["score"]) for e in phase_data.read_events(job)]


# capacity 3, eviction oldest; the local schedule: step 1 fill plays x = 1 (group 2), steps 2
# and 3 replay one item each, step 4 fill plays x = 2, steps 5 and 6 replay, circularly
# from the cursor (the replay's acc: 1 for x = 2, else 0.5)
EXPECTED = [
    (1, "filler", "push", 0, None), (1, "filler", "push", 1, None),
    (2, "learner", "replay", 0, 0.5), (3, "learner", "replay", 1, 0.5),
    (4, "filler", "push", 2, None), (4, "filler", "evict", 0, None), (4, "filler", "push", 3, None),
    (5, "learner", "replay", 1, 0.5), (6, "learner", "replay", 2, 1.0),
]


def test_replaying_phase_draws_from_the_buffer_as_it_stands(tmp_path) -> None:
    job = compile_job(tmp_path)
    assert (job / "phase-2-learner" / "prompts.jsonl").read_text() == ""  # drawn when the phase starts
    assert "askspec.runtime.targets.openrlhf.phase_data" in (job / "README.md").read_text()
    rc, launches = drive(job, tmp_path)
    assert rc == 0
    ckpt = job / "ckpt"
    assert phases(launches) == [["phase-1-filler", "HuggingFaceTB/SmolLM2-135M-Instruct"],
                        ["phase-2-learner", "HuggingFaceTB/SmolLM2-135M-Instruct"],
                        ["phase-1-filler", f"{ckpt}/iter-1/filler"],
                        ["phase-2-learner", f"{ckpt}/iter-1/learner"]]
    assert events(job) == EXPECTED
    # the last phases' prompts, each labelled with its local step: the filler's x = 2 (the
    # local planner's next element), the learner's items 1 ({x: 1}) and 2 ({x: 2}), one a step
    labels = [json.loads(json.loads(x)["label"]) for x in (job / "phase-1-filler" / "prompts.jsonl").read_text().splitlines()]
    assert [(lb["element"], lb["bindings"], lb["draw"]["step"]) for lb in labels] == [(1, {"x": 2}, 4)]
    labels = [json.loads(json.loads(x)["label"]) for x in (job / "phase-2-learner" / "prompts.jsonl").read_text().splitlines()]
    assert [(lb["element"], lb["bindings"], lb["draw"]["step"]) for lb in labels] == [(1, {"item": {"x": 1}}, 5),
                                                                             (2, {"item": {"x": 2}}, 6)]
    state = json.loads((job / phase_data.STATE).read_text())
    assert state["buffers"]["seen"]["ids"] == [1, 2, 3] and state["buffers"]["seen"]["cursor"] == 2
    assert state["committed"] == ["iter-1-filler", "iter-1-learner", "iter-2-filler", "iter-2-learner"]
    # OpenRLHF's own parser: one element or drawn item (2 rollouts) a step, one pass over the phase's prompts
    for launch, steps in ((launches[2], 1), (launches[3], 2)):
        args = parse_train_ppo_ray(train_flags(["ray", *launch[2]]))
        assert (args.rollout.batch_size, args.rollout.n_samples_per_prompt, args.train.num_episodes) == (1, 2, 1)
        assert args.train.batch_size == 2
    # the events are the job's run store's, as `askspec query` shows a local run's
    assert main(["query", str(job / phase_data.STORE), "SELECT count(*) AS n FROM buffer_events"]) == 0


def test_a_short_buffers_steps_take_what_it_holds(tmp_path) -> None:
    """phase_data's draw for a learner step of 3 items (batch = 6 in groups of 2): from a
    buffer of 2 every step replays both, and launch.args sets the launch's step to 2
    prompts of 2 rollouts (OpenRLHF's parser: the last value wins); from a buffer of 3
    launch.args is empty (the launch line's own 3 and 6)."""
    from askspec.runtime.scoring.buffers import ReplayBuffer

    job = compile_job(tmp_path, "buffer_short.ask")
    phase = job / "phase-2-learner"
    flags = train_flags(launch_argv(phase / "launch.sh", tmp_path, {"ACTOR_GPUS": "2"})[0])
    for held, step in ((2, 2), (3, 3)):
        buf = ReplayBuffer("seen", 3)
        for x in range(held):
            buf.add({"x": x})
        (job / phase_data.STATE).parent.mkdir(parents=True, exist_ok=True)
        (job / phase_data.STATE).write_text(json.dumps({"buffers": {"seen": buf.state()}, "committed": []}))
        assert phase_data.prompts(job, phase, 1) == 2 * step  # the phase's 2 local steps
        extra = (phase / phase_data.LAUNCH_ARGS).read_text().split()
        assert (extra == []) == (held == 3)
        args = parse_train_ppo_ray([*flags, *extra])
        assert (args.rollout.batch_size, args.train.batch_size) == (step, step * 2)
        assert args.train.num_episodes * (2 * step // args.rollout.batch_size) == 2  # an OpenRLHF step a local one


@pytest.mark.slow  # a driver run: a process per phase_data call
def test_a_buffer_shorter_than_a_step_sets_the_steps_batch(tmp_path) -> None:
    """A learner step replays 3 items (batch = 6 in groups of 2); iteration 1's buffer
    holds 2, so each of its steps replays both, as the local step does: its launch takes
    2 prompts a step (launch.args, passed by driver.sh), and OpenRLHF still runs one step
    per local step; iteration 2's buffer holds 3, a full step."""
    job = compile_job(tmp_path, "buffer_short.ask")
    rc, launches = drive(job, tmp_path)
    assert rc == 0
    assert [launch[0] for launch in launches] == ["phase-1-filler", "phase-2-learner"] * 2
    replays: dict[int, int] = {}  # local step -> items it replayed (the committed events)
    for step, _, event, _, _ in events(job):
        if event == "replay":
            replays[step] = replays.get(step, 0) + 1
    assert replays == {2: 2, 3: 2, 5: 3, 6: 3}
    for launch, steps in ((launches[1], (2, 3)), (launches[3], (5, 6))):
        args = parse_train_ppo_ray(train_flags(["ray", *launch[2]]))
        prompts = replays[steps[0]]
        assert (args.rollout.batch_size, args.train.batch_size) == (prompts, prompts * 2)
        drawn = sum(replays[s] for s in steps)
        assert args.train.num_episodes * (drawn // args.rollout.batch_size) == 2  # the phase's 2 local steps


def test_a_failed_phase_is_played_again_and_its_rollouts_never_pushed(tmp_path) -> None:
    job = compile_job(tmp_path)
    rc, launches = drive(job, tmp_path, fail_at=3)  # phase 3: iteration 2's filler, after its rollouts
    assert rc != 0 and [p for p, _ in phases(launches)] == ["phase-1-filler", "phase-2-learner", "phase-1-filler"]
    assert [e for e in events(job) if e[0] > 3] == []
    rc, launches = drive(job, tmp_path)
    assert rc == 0
    assert phases(launches) == [["phase-1-filler", f"{job / 'ckpt'}/iter-1/filler"],
                        ["phase-2-learner", f"{job / 'ckpt'}/iter-1/learner"]]  # resumed at phase 3
    assert events(job) == EXPECTED
    assert len(list((job / "runs").glob("iter-2-filler.interrupted-*"))) == 1  # set aside, not committed


def test_commit_is_done_once(tmp_path) -> None:
    """A kill between a phase's commit and its done/ marker: the re-run neither plays the
    phase again nor commits it twice."""
    job = compile_job(tmp_path)
    assert drive(job, tmp_path)[0] == 0
    before = events(job)
    (job / "done" / "iter-2-learner").unlink()
    rc, launches = drive(job, tmp_path)
    assert rc == 0 and launches == [] and events(job) == before


def test_an_empty_buffer_skips_the_replaying_phase(tmp_path) -> None:
    """Nothing pushed: the learner's phase is not launched and keeps its weights."""
    job = compile_job(tmp_path)
    (job / "phase-1-filler" / phase_data.ELEMENTS).write_text("")  # the filler plays no element
    rc, launches = drive(job, tmp_path)
    assert rc == 0
    assert [p for p, _ in phases(launches)] == ["phase-1-filler", "phase-1-filler"]
    assert not (job / "ckpt" / "iter-1" / "learner").exists()
    assert events(job) == []


@pytest.mark.parametrize("edit, why", [
    (("eviction = oldest", "eviction = solved_or_no_peak"), "its eviction `solved_or_no_peak` depends on each replay's score"),
    (("    reward learner = acc\n", "    reward learner = acc\n    push seen: {x: 0}\n"),
     "the game pushes to the buffer it replays"),
    (("games = {filler: fill, learner: replay}", "games = {filler: fill, learner: [fill, replay]}"),
     "the phase that trains 'learner' also plays fill"),
    (("schedule alternating { filler = 1; learner = 2; iterations = 2; games = {filler: fill, learner: replay} }\n", ""),
     "only an alternating schedule's driver rebuilds it between phases"),
])
def test_what_cannot_be_drawn_ahead_is_refused(tmp_path, capsys, edit, why) -> None:
    text = (SPECS / "buffer_alternating.ask").read_text()
    assert edit[0] in text
    spec = tmp_path / "spec.ask"
    spec.write_text(text.replace(edit[0], edit[1]))
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(tmp_path / "job")]) == 1
    err = capsys.readouterr().err
    assert "error[E605]: game 'replay' replays buffer 'seen'" in err and why in err, err
    assert not (tmp_path / "job").exists()


def test_a_commit_killed_before_its_state_is_written_again_once(tmp_path, monkeypatch) -> None:
    """Killed after a phase's events were written but before the state named the phase:
    the commit runs again and its events are there once."""
    job = compile_job(tmp_path)
    assert drive(job, tmp_path)[0] == 0
    whole = events(job)
    state = json.loads((job / phase_data.STATE).read_text())
    state["committed"].remove("iter-2-learner")
    state["buffers"]["seen"]["cursor"] = 0  # where the phase's replays started (the draw must match its plan)
    (job / phase_data.STATE).write_text(json.dumps(state))
    real = phase_data.write_json_atomic

    def killed(path, data):
        if Path(path).name == "state.json":
            raise KeyboardInterrupt  # the process dies here
        real(path, data)

    monkeypatch.setattr(phase_data, "write_json_atomic", killed)
    runs = job / "runs" / "iter-2-learner"
    try:
        phase_data.commit(job, job / "phase-2-learner", runs, "iter-2-learner", 2)
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(phase_data, "write_json_atomic", real)
    phase_data.commit(job, job / "phase-2-learner", runs, "iter-2-learner", 2)
    assert events(job) == whole


AGENT_RAY = '''#!{python}
# OpenRLHF's launch played by the phase's own agent (agent.py, loaded by OpenRLHF's loader)
# through OpenRLHF's generate_responses, the trained role answered by a scripted engine
import asyncio, json, os, sys
from pathlib import Path
sys.path.insert(0, {harness!r})
from openrlhf_harness import FakeEngine, FakeSamplingParams, generate_responses, load_agent_executor, smollm2_tokenizer
from askspec.runtime.backends.registry import aclose_backends

argv = sys.argv[1:]
flag = lambda name: argv[argv.index(name) + 1]
phase = Path.cwd()
# the weights it starts from: the carried checkpoint's (driver.sh's --ckpt.load_enable: askspec_ext/carry.py
# has OpenRLHF load the role's previous phase's state from --ckpt.path/_actor), else --actor.model_name_or_path
carried = Path(flag("--ckpt.path")) / "_actor" / "from"
start = carried.read_text() if "--ckpt.load_enable" in argv and carried.exists() else flag("--actor.model_name_or_path")
with open(os.environ["LAUNCH_LOG"], "a") as f:
    f.write(json.dumps([phase.name, start, argv]) + "\\n")
tokenizer = smollm2_tokenizer()
executor = load_agent_executor(phase / "agent.py")
engine = FakeEngine(executor, tokenizer, lambda prompt: "ok")

async def play():
    for line in reversed((phase / "prompts.jsonl").read_text().splitlines()):
        line = json.loads(line)
        await generate_responses(engine, line["prompt"], line["label"], FakeSamplingParams(logprobs=1), 4096,
                                 tokenizer, int(flag("--rollout.n_samples_per_prompt")))
    await aclose_backends()

asyncio.run(play())
executor.agent.close()
out = Path(flag("--ckpt.output_dir"))
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text("{{}}")
if "--ckpt.load_enable" in argv:  # the state saved at the phase's last step (carry.py)
    carried.parent.mkdir(parents=True, exist_ok=True)
    carried.write_text(str(out))
'''


@pytest.mark.slow  # the SmolLM2 tokenizer, loaded by every launch
def test_the_agents_own_records_fill_and_replay_the_buffer(tmp_path) -> None:
    """The phases played by their generated agents (the engine records the sessions and
    their pushes; `replay` reads the drawn item's fields): the same buffer events as the
    recorded stand-in's, every replay scoring the game's acc = 1."""
    job = compile_job(tmp_path)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "ray").write_text(AGENT_RAY.format(python=sys.executable, harness=str(Path(__file__).parent)))
    (stubs / "ray").chmod(0o755)
    log = tmp_path / "launches.log"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "LAUNCH_LOG": str(log), "ACTOR_GPUS": "2",
           "PHASE_DATA": f"{sys.executable} -m askspec.runtime.targets.openrlhf.phase_data"}
    done = subprocess.run(["bash", str(job / "driver.sh")], env=env, cwd=tmp_path, timeout=600,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(x)[0] for x in log.read_text().splitlines()] == ["phase-1-filler", "phase-2-learner"] * 2
    assert events(job) == [(s, p, e, item, 1.0 if e == "replay" else None) for s, p, e, item, _ in EXPECTED]
    state = json.loads((job / phase_data.STATE).read_text())
    assert state["buffers"]["seen"]["items"] == [{"x": 1}, {"x": 2}, {"x": 2}]


def test_pasodobles_proposer_phases_play_the_local_schedules_steps(tmp_path) -> None:
    """specs/pasodoble.ask itself: each iteration's proposer phase plays the passages the
    local trainer's own planner gives its steps (the data set shuffled by the seed, the
    walk continuing over iterations), each prompt labelled with the local global step
    (the stages before the RL stage counted)."""
    from askspec.ir import model as ir
    from askspec.runtime.engine.plan import load_dataset
    from askspec.runtime.train.trainer import LocalTrainer

    job = tmp_path / "job"
    assert main(["compile", str(SPECS.parents[2] / "specs" / "pasodoble.ask"), "--target", "openrlhf", "-o", str(job),
                 "--set", "iterations=2", "--set", "proposer_steps=2", "--set", "solver_steps=1"]) == 0
    phase = job / "phase-1-proposer"
    assert (phase / "prompts.jsonl").read_text() == ""  # drawn when the phase starts
    exp = ir.Experiment.model_validate(json.loads((phase / "job.json").read_text())["experiment"])
    seed = int(exp.options.get("seed", 0) or 0)
    datasets = {d.name: load_dataset(d, str(phase / "spec"), seed) for d in exp.datasets}
    local = LocalTrainer(exp, params=exp.param_values(), datasets=datasets, seed=seed, resolver=None, run_dir=None)
    played = set()
    for it in (1, 2):
        assert phase_data.prompts(job, phase, it) == 2
        labels = [json.loads(json.loads(x)["label"]) for x in (phase / "prompts.jsonl").read_text().splitlines()]
        want = []
        for sl in local.slots:
            if sl.phase.kind == "play" and sl.iteration == it and sl.phase.name == "proposer":
                plans = local.planners["proposer"].plans(sl.n, local.index0[sl.step - 1], sl.step)
                want += [(sl.step, p.game, p.bindings) for p in plans]  # one session a passage (its sample siblings)
        assert [(lb["draw"]["step"], lb["game"], lb["bindings"]) for lb in labels] == want
        played |= {lb["bindings"]["passage"]["id"] for lb in labels}
    assert len(played) == 4  # two passages a phase, none played twice


def test_an_iteration_past_the_schedule_is_refused(tmp_path, capsys) -> None:
    """ITERATIONS beyond the spec's: the drawn phases have no local steps to play."""
    job = compile_job(tmp_path)
    assert phase_data.main(["prompts", str(job), "phase-1-filler", "--iteration", "2"]) == 0
    assert phase_data.main(["prompts", str(job), "phase-1-filler", "--iteration", "3"]) == 1
    assert "iteration 3 is past the spec's schedule" in capsys.readouterr().err


def test_pasodobles_solver_phase_steps_are_the_local_steps(tmp_path) -> None:
    """specs/pasodoble.ask's offline solver step replays `replay_questions` buffered questions,
    each one session of `solutions` answers (its `sample` siblings: one prompt): the solver
    phase's launch line plays that many prompts a step (--rollout.batch_size) and their
    answers (--train.batch_size), and phase_data draws them, step by step, as the local
    trainer's own plans take them from the same buffer."""
    from types import SimpleNamespace

    from askspec.ir import model as ir
    from askspec.runtime.engine.plan import load_dataset
    from askspec.runtime.scoring.buffers import ReplayBuffer
    from askspec.runtime.train.trainer import LocalTrainer

    job = tmp_path / "job"
    assert main(["compile", str(SPECS.parents[2] / "specs" / "pasodoble.ask"), "--target", "openrlhf", "-o", str(job),
                 "--set", "iterations=1", "--set", "proposer_steps=1", "--set", "solver_steps=2"]) == 0
    phase = job / "phase-2-solver"
    exp = ir.Experiment.model_validate(json.loads((phase / "job.json").read_text())["experiment"])
    seed = int(exp.options.get("seed", 0) or 0)
    datasets = {d.name: load_dataset(d, str(phase / "spec"), seed) for d in exp.datasets}
    local = LocalTrainer(exp, params=exp.param_values(), datasets=datasets, seed=seed, resolver=None, run_dir=None)
    # more questions than a step replays, so each step replays a full batch and the second wraps around
    buf = ReplayBuffer("questions", 100)
    for i in range(20):
        buf.add({"question": f"q{i}", "answer": str(i), "pass_rate": 0.5})
    (job / phase_data.STATE).parent.mkdir(parents=True, exist_ok=True)
    (job / phase_data.STATE).write_text(json.dumps({"buffers": {"questions": buf.state()}, "committed": []}))

    n = phase_data.prompts(job, phase, 1)
    labels = [json.loads(json.loads(x)["label"]) for x in (phase / "prompts.jsonl").read_text().splitlines()]
    engine = SimpleNamespace(buffers={"questions": ReplayBuffer("questions", 100)})
    engine.buffers["questions"].restore(buf.state())
    want, per_step = [], []
    for sl in local.slots:
        if sl.phase.kind == "play" and sl.phase.name == "solver":
            plans, _ = local.plans(sl, engine)
            want += [(sl.step, p.game, p.bindings) for p in plans]
            per_step.append(len(plans))
    assert [(lb["draw"]["step"], lb["game"], lb["bindings"]) for lb in labels] == want
    assert per_step == [12, 12] and n == 24  # replay_questions a step

    args = parse_train_ppo_ray(train_flags(launch_argv(phase / "launch.sh", tmp_path)[0]))
    assert args.rollout.batch_size == per_step[0]  # one local step's sessions, one prompt each
    assert args.rollout.n_samples_per_prompt == exp.param_values()["solutions"]  # a session's `sample` replies
    assert args.train.batch_size == per_step[0] * args.rollout.n_samples_per_prompt  # 72 answers
    assert args.train.num_episodes * (n // args.rollout.batch_size) == len(per_step)  # one OpenRLHF step a local one


@pytest.fixture(scope="module")
def _compiled_alternating(tmp_path_factory) -> Path:
    return compile_job(tmp_path_factory.mktemp("compiled"))


@pytest.fixture
def alternating_job(_compiled_alternating, capsys):
    """A fresh copy of buffer_alternating.ask's job under a test's folder (compiled once)."""
    import shutil

    def copy(where: Path) -> Path:
        capsys.readouterr()  # the compile's own lines
        return Path(shutil.copytree(_compiled_alternating, where / "job"))
    return copy


@pytest.mark.parametrize("garbled, why", [
    (b"{garbled", "is not valid JSON: Expecting property name"),
    (b"\xff\xfe{}", "is not UTF-8 text (byte 0: invalid start byte)"),
    (b"[]", "is not the job's buffer state (not an object)"),
    (b'{"buffers": 3, "committed": []}', "is not the job's buffer state (its `buffers` is not an object)"),
    (b'{"buffers": {}, "committed": 5}', "is not the job's buffer state (its `committed` is not a list of keys)"),
    (b'{"buffers": {"seen": 7}, "committed": []}', "(buffer 'seen': not an object)"),
    (b'{"buffers": {"seen": {}}, "committed": []}', "(buffer 'seen': `items` is missing or not a list)"),
    (b'{"buffers": {"seen": {"items": [1], "ids": [], "next_id": 1, "cursor": 0, "stats": {}}}, "committed": []}',
     "(buffer 'seen': `ids` is not one integer per item)"),
], ids=["json", "utf8", "list", "buffers", "committed", "buffer", "items", "ids"])
def test_a_garbled_buffer_state_is_one_error_line(tmp_path, capsys, alternating_job, garbled, why) -> None:
    """buffers/state.json damaged (a disk filled mid-write, a hand edit): `prompts`,
    `commit` and `committed` each say so in one line, exit 1, never a traceback."""
    job = alternating_job(tmp_path)
    (job / phase_data.STATE).parent.mkdir(parents=True, exist_ok=True)
    (job / phase_data.STATE).write_bytes(garbled)
    for argv in (["prompts", str(job), "phase-2-learner"], ["commit", str(job), "phase-2-learner", str(tmp_path), "k"],
                 ["committed", str(job), "k"]):
        assert phase_data.main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {job / phase_data.STATE} ") and why in err and err.count("\n") == 1, err


def test_a_buffer_state_that_is_not_a_regular_file_or_too_large_is_refused(tmp_path, capsys, monkeypatch,
                                                                           alternating_job) -> None:
    job = alternating_job(tmp_path)
    state = job / phase_data.STATE
    state.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(state)  # waited on for good if opened for reading
    assert phase_data.main(["prompts", str(job), "phase-2-learner"]) == 1
    assert capsys.readouterr().err == f"error: {state} is a FIFO (named pipe), not a regular file\n"
    state.unlink()
    state.write_text(json.dumps({"buffers": {}, "committed": []}) + " " * 64)
    monkeypatch.setattr(phase_data, "MAX_STATE_BYTES", 32)
    assert phase_data.main(["committed", str(job), "k"]) == 1
    assert capsys.readouterr().err == f"error: {state} is {state.stat().st_size} bytes; the limit is 32 bytes\n"
