"""The batch sizes an OpenRLHF 0.11.2 job can start with on a given number of actor GPUs:
the compiler picks a job's default ACTOR_GPUS with it, and every generated launch.sh runs
it (copied beside it as world_check.py, Python's standard library only) on the real
train_ppo_ray arguments — the environment's sizes, launch.args and extra arguments
included — before `ray job submit`.

Two rules, mirrored from the code that enforces them inside the job:

- OpenRLHF's own (train_ppo_ray's main block, a bare assert): n_samples_per_prompt x
  rollout.batch_size // rollout.micro_batch_size >= actor.num_nodes x
  actor.num_gpus_per_node // ds.ring_attn_size // ds.tensor_parallel_size;
- DeepSpeed's batch assertion (runtime/config.py, `_set_batch_related_parameters` and
  `_batch_assertion`), on the config OpenRLHF's DeepspeedStrategy writes
  (`train_batch_size` = train.batch_size x ring_attn_size x tensor_parallel_size,
  `train_micro_batch_size_per_gpu` = train.micro_batch_size; no accumulation steps, so
  DeepSpeed derives them as train_batch_size // micro // world size) for the actor, the
  reference model and a critic alike (launch.sh gives them the same nodes and GPUs):
  accumulation >= 1 and train_batch_size == micro x accumulation x world size. With
  `--train.dynamic_batch_enable` OpenRLHF sets micro 1 and accumulation 1 itself and
  writes no train_batch_size, so the rule does not apply.

The multi-policy job's driver pads each role's step to whole groups and whole DeepSpeed
steps for the actors it gets (askspec_ext/multi_policy.py's `step_batch`, `padded_batch`
here): with `--padded` the rules are checked on the batch so padded, as the job will run it.

`python3 world_check.py [--given] [--padded] -- ARGS...` prints the actor GPUs per node to launch
with: the ones ARGS name when both rules hold; with ACTOR_GPUS left to its default (no
`--given`), the largest count below it that fits (a replaying phase's short step, from
launch.args); else it prints why on stderr, naming the setting to change, and exits 2.
"""

from __future__ import annotations

import math
import sys

# train_ppo_ray's flags the rules read, with OpenRLHF 0.11.2's defaults
DEFAULTS = {"--rollout.batch_size": 1024, "--rollout.n_samples_per_prompt": 1, "--rollout.micro_batch_size": 1,
            "--train.batch_size": 128, "--train.micro_batch_size": 1, "--ds.ring_attn_size": 1,
            "--ds.tensor_parallel_size": 1, "--actor.num_nodes": 1, "--actor.num_gpus_per_node": 8}
DYNAMIC = "--train.dynamic_batch_enable"
# the most GPUs per node listed as a choice in a refusal
MOST_GPUS = 16


def settings(argv: list[str]) -> dict[str, int]:
    """The values ARGS give the flags the rules read, as argparse reads them (the last
    occurrence wins; `--flag value` or `--flag=value`); DYNAMIC is 1 when given."""
    out = dict(DEFAULTS)
    out[DYNAMIC] = 0
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name == DYNAMIC and not eq:
            out[DYNAMIC] = 1
        elif name in DEFAULTS:
            text = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                out[name] = int(text)
            except ValueError:
                pass  # argparse refuses it inside the job, with its own message
    return out


def problem(s: dict[str, int]) -> str | None:
    """Why a job with settings `s` cannot start (the first rule that fails), else None."""
    world = s["--actor.num_nodes"] * s["--actor.num_gpus_per_node"]
    ring, tp = s["--ds.ring_attn_size"], s["--ds.tensor_parallel_size"]
    n, prompts = s["--rollout.n_samples_per_prompt"], s["--rollout.batch_size"]
    if min(world, ring, tp, n, prompts, s["--rollout.micro_batch_size"], s["--train.micro_batch_size"]) < 1:
        return None  # argparse's or OpenRLHF's own checks say what is wrong
    rollouts = n * prompts
    if rollouts // s["--rollout.micro_batch_size"] < world // ring // tp:
        return (f"a step of this job trains on {rollouts} rollouts ({prompts} prompt(s) x {n}), and OpenRLHF needs at "
                f"least one per actor process, but the job has {world} (ACTOR_NODES x ACTOR_GPUS)")
    if s[DYNAMIC]:
        return None
    micro, total = s["--train.micro_batch_size"], s["--train.batch_size"] * ring * tp
    accumulation = total // micro // world
    if accumulation < 1 or total != micro * accumulation * world:
        scaled = f" x ring_attn_size x tensor_parallel_size = {total}" if ring * tp > 1 else ""
        return (f"DeepSpeed needs --train.batch_size ({s['--train.batch_size']}{scaled}) to be a whole multiple of "
                f"--train.micro_batch_size ({micro}) x the actor GPUs ({world}: ACTOR_NODES x ACTOR_GPUS)")
    return None


def padded_batch(rollouts: int, n: int, micro: int, world: int) -> int:
    """The rollouts a step is padded to: at least `rollouts` (and one group), whole groups
    of `n` and whole DeepSpeed steps (`micro` x the `world` of data-parallel actors)."""
    unit = math.lcm(n, micro * max(world, 1))
    return -(-max(rollouts, n) // unit) * unit


def padded(s: dict[str, int]) -> dict[str, int]:
    """`s` with its step batch padded as the multi-policy driver pads it for these actors."""
    n = max(s["--rollout.n_samples_per_prompt"], 1)
    world = s["--actor.num_nodes"] * s["--actor.num_gpus_per_node"] // max(
        s["--ds.ring_attn_size"] * s["--ds.tensor_parallel_size"], 1)
    size = padded_batch(s["--train.batch_size"], n, max(s["--train.micro_batch_size"], 1), world)
    return {**s, "--train.batch_size": size, "--rollout.batch_size": size // n}


def fitting_gpus(s: dict[str, int], most: int, pad: bool = False) -> list[int]:
    """The GPUs per node, 1..most, with which `s` (its nodes as they are) can start."""
    return [g for g in range(1, most + 1) if check({**s, "--actor.num_gpus_per_node": g}, pad) is None]


def check(s: dict[str, int], pad: bool) -> str | None:
    return problem(padded(s) if pad else s)


def main(argv: list[str]) -> int:
    options = argv[: argv.index("--")] if "--" in argv else []
    given, pad = "--given" in options, "--padded" in options
    args = argv[argv.index("--") + 1:] if "--" in argv else argv
    s = settings(args)
    gpus = s["--actor.num_gpus_per_node"]
    why = check(s, pad)
    if why is None:
        print(gpus)
        return 0
    fits = fitting_gpus(s, max(gpus, MOST_GPUS), pad)
    if not given and any(g < gpus for g in fits):
        lower = max(g for g in fits if g < gpus)
        print(f"launch.sh: ACTOR_GPUS defaults to {lower} for this launch, not {gpus}: {why}", file=sys.stderr)
        print(lower)
        return 0
    nodes = s["--actor.num_nodes"]
    if fits:
        change = (f"set ACTOR_GPUS to one of {', '.join(map(str, fits))} (with ACTOR_NODES={nodes})"
                  + ("" if nodes == 1 else ", or change ACTOR_NODES"))
    elif s["--train.micro_batch_size"] > 1 or s["--rollout.micro_batch_size"] > 1:
        change = "no GPU count fits: lower --train.micro_batch_size (the train block's `micro_batch`)"
    else:
        change = "no GPU count fits: change ACTOR_NODES"
    print(f"launch.sh: {why}: {change}; nothing was submitted", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
