"""Test scaffolding, not a product fake: OpenRLHF's launch of one phase replaced by
askspec's local trainer (tests/targets/test_openrlhf_paso_e2e.py).

Run where launch.sh runs `ray job submit ... -- python3 -m openrlhf.cli.train_ppo_ray
FLAGS` (a `ray` on PATH that execs this file, in the phase's folder), it trains the phase
as the local alternating schedule trains its steps, on CPU:

- the phase's steps are the local steps its prompts.jsonl labels name (driver.sh draws
  them: phase_data.py); each is played and trained by LocalTrainer's own `_play` and
  `_train`; a step whose sessions are not the prompts' (game, bindings, in order) stops
  the launch with exit 3: the driver drew other prompts than the local schedule plays;
- the trained role starts from `--actor.model_name_or_path` (the driver's PRETRAIN), the
  other trained roles play frozen from the weights driver.sh handed serve_frozen.sh
  (the test's serve_frozen.sh writes its CKPT_* variables to frozen.json), and a
  replaying phase's buffer is the driver's (buffers/state.json) as the phase starts;
- with `--ckpt.load_enable` (driver.sh's flags of a phase that carries its role's state:
  askspec_ext/carry.py), the role's checkpoint under `--ckpt.path` (`_actor`), where
  OpenRLHF's PolicyModelActor loads its DeepSpeed checkpoint from, replaces the weights
  and AdamW's moments and step (and the schedule's step), and the phase's end writes it
  there again, as the hook has OpenRLHF save at the phase's last step; without it AdamW
  starts afresh, as an OpenRLHF launch's DeepSpeed optimizer does;
- the diversity()/novelty() histories start from the phase's history.json (the earlier
  phases' calls, as the agent's `carried_history` replays them);
- the sessions go to a run store under $ASKSPEC_RUNS as the phase's agents record them
  (no buffer events: the driver commits those), and the trained weights, as a Hugging
  Face folder, to `--ckpt.output_dir`, where OpenRLHF writes them.

LAUNCH_LOG (a file) gets one JSON line per launch: [phase folder, the weights it starts
from (the carried checkpoint's phase output, else PRETRAIN), argv]. With
KILL_AT = N, the N-th launch kills its process group with SIGKILL once its sessions are
recorded (driver.sh and everything it started: a node lost during the phase)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def main(argv: list[str]) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from askspec.ir import model as ir
    from askspec.ir.canonical import experiment_hash, to_json
    from askspec.runtime.backends.hf import default_threads
    from askspec.runtime.commands.resolver import local_resolver
    from askspec.runtime.engine.plan import load_dataset
    from askspec.runtime.engine.session import Engine
    from askspec.runtime.store.writer import RunWriter
    from askspec.runtime.targets.openrlhf import phase_data
    from askspec.runtime.targets.openrlhf.adapter import carried_history
    from askspec.runtime.train.trainer import LocalTrainer
    from askspec.runtime.train.steplog import StepLog, jsonable

    torch.set_num_threads(default_threads())  # as `askspec run` sets them: the same float sums as the local run
    phase = Path.cwd()
    pretrain, out = _flag(argv, "--actor.model_name_or_path"), Path(_flag(argv, "--ckpt.output_dir"))
    carried = Path(_flag(argv, "--ckpt.path")) / "_actor" if "--ckpt.load_enable" in argv else None
    # the weights it starts from: the carried checkpoint's (the phase that wrote it), else PRETRAIN
    start = (carried / "from").read_text() if carried is not None and (carried / "from").exists() else pretrain
    with open(os.environ["LAUNCH_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps([phase.name, start, argv]) + "\n")
    job = json.loads((phase / "job.json").read_text(encoding="utf-8"))
    exp = ir.Experiment.model_validate(job["experiment"])
    seed, params, role = int(job["seed"]), exp.param_values(), job["trained_role"]
    datasets = {d.name: load_dataset(d, str(phase / "spec"), seed) for d in exp.datasets}
    trainer = LocalTrainer(exp, params=params, datasets=datasets, seed=seed,
                           resolver=local_resolver(exp, str(phase / "spec")), run_dir=phase / "standin")
    trainer.load_policies(resume_from=None)
    frozen = json.loads((phase / "frozen.json").read_text(encoding="utf-8")) if (phase / "frozen.json").exists() else {}
    for name, policy in trainer.policies.items():
        weights = pretrain if name == role else frozen.get(f"CKPT_{name.upper()}")
        if weights and Path(weights).is_dir():
            policy.take_weights(AutoModelForCausalLM.from_pretrained(weights).state_dict())

    if carried is not None and carried.is_dir():
        policy = trainer.policies[role]
        policy.take_weights(AutoModelForCausalLM.from_pretrained(carried).state_dict())
        policy.load_optimizer(carried)

    lines = [json.loads(x) for x in (phase / "prompts.jsonl").read_text(encoding="utf-8").splitlines()]
    labels = [json.loads(x["label"]) for x in lines]
    steps = sorted({int(lb["draw"]["step"]) for lb in labels})
    writer = RunWriter.create(os.environ["ASKSPEC_RUNS"], experiment=exp.name, experiment_hash=experiment_hash(exp),
                              ir_json=to_json(exp), spec_files={}, seed=seed, roles={}, params=params,
                              planned_sessions=0, argv=["openrlhf-standin", *argv])
    log = StepLog(writer)
    log.buffer_event = lambda **event: None  # the agents record sessions only; driver.sh commits the buffers
    engine = Engine(trainer.engine_experiment(), params=params, datasets=datasets, seed=seed, writer=log,
                    stateful=carried_history(phase), resolve_model=trainer.resolve,
                    rollout_roles=frozenset(trainer.policies), on_rollout=log.rollout)
    state = json.loads((phase.parent / phase_data.STATE).read_text()) if (phase.parent / phase_data.STATE).exists() else {}
    for name, buf in engine.buffers.items():
        if name in state.get("buffers", {}):
            buf.restore(state["buffers"][name])
    loop = asyncio.new_event_loop()
    metrics: dict = {}
    for step in steps:
        sl = trainer.slots[step - 1]
        if sl.phase.name != role:
            print(f"standin: prompts.jsonl names step {step}, a step of phase '{sl.phase.name}', not '{role}'",
                  file=sys.stderr)
            return 3
        played = loop.run_until_complete(trainer._play(sl, engine, log))
        # the step's elements in plan order (a group's sessions share one), against its prompts
        want = [json.dumps([lb["game"], lb["bindings"]], sort_keys=True) for lb in labels if lb["draw"]["step"] == step]
        got = list(dict.fromkeys(json.dumps([p.game, p.bindings], sort_keys=True) for p in played.plans))
        if got != want:
            print(f"standin: step {step} plays {got}, but the driver's prompts are {want}", file=sys.stderr)
            return 3
        metrics, _ = trainer._train(sl, played)
    writer.close()
    if os.environ.get("KILL_AT") == str(sum(1 for _ in open(os.environ["LAUNCH_LOG"], encoding="utf-8"))):
        os.killpg(os.getpgid(0), signal.SIGKILL)
    trainer.policies[role].save(out, steps[-1], jsonable(metrics.get(role, {})), with_optimizer=False)
    if carried is not None:
        trainer.policies[role].save(carried, steps[-1], jsonable(metrics.get(role, {})))
        (carried / "from").write_text(str(out), encoding="utf-8")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[args.index("--") + 1:] if "--" in args else args))
