"""askspec's training step on OpenRLHF 0.11.2: the update gate of `update_when` (a training
step whose sessions close the train block's gate takes no update: PasoDoble's skip-update
rule, Alg. 2 l.24–28) and the step with no loss token (every rollout dropped, failed or
unrewarded, e.g. a SOAR step whose inner loop failed), which OpenRLHF would train on as
0 / 0 tokens in `aggregate_loss` (NaN) and askspec's trainer skips (`skipped =
'no_tokens'`).

OpenRLHF's trainer runs one `BasePPOTrainer.train_step(rollout_samples, global_step)` per
rollout batch (`PPOTrainer.fit`, and `PPOTrainerAsync`'s loop): it makes the experiences
(the actor's, reference's and critic's forward passes), appends them to the actors'
replay buffers and runs their `fit` (backward and `optimizer_step`: AdamW and the
learning-rate scheduler), then sends the weights to vLLM. The hook looks at the batch
first: a step with no loss token (no rollout the agent trained a turn of with an action
token left: the rule of askspec_ext/advantages.py's `members`), or whose sessions close
the gate (the agent writes each rollout's session into its label;
askspec.runtime.targets.openrlhf.update_gate evaluates them with askspec's own
evaluator, as the local trainer does), runs none of that — no forward or backward pass,
no AdamW step (weights and optimizer state unchanged), nothing sent to vLLM; a step with no
loss token still steps the learning-rate scheduler, as the local schedule counts it, and a
gated one does not — and returns OpenRLHF's rollout statistics with `askspec/skipped` 1 (and
`askspec/gate` 0 when gated), so `fit` goes on as after any step: the global step counts
it, and a checkpoint due at it is written (as a local run's skipped step: docs/training.md,
"Skipped steps"). Every step the hook sees is recorded as a `train_steps` row in a run
store of the trainer's own under $ASKSPEC_RUNS (`skipped = 'no_tokens'` or `'gate'`).

Every RL job with askspec's advantages or an update gate installs it (job.json's
`extension`). `install()` wraps the method (once); `install_when_loaded()` is the Ray
workers' hook (the PPO trainer is a Ray actor). Both refuse an OpenRLHF whose hooked code
is not 0.11.2's. Needs askspec (installed on every node for the agent) besides OpenRLHF."""

from __future__ import annotations

import importlib
from typing import Any

from . import pinned

MODULE = "openrlhf.trainer.ppo_trainer"
HOOKED = [("trainer/ppo_trainer.py", "BasePPOTrainer", "train_step"),
          ("trainer/ppo_trainer.py", "BasePPOTrainer", "_compute_rollout_stats")]
# sha256 of the hooked methods as OpenRLHF 0.11.2 ships them (pinned.fingerprint(sources()))
FINGERPRINT = "02faeb5f2f4956709879fcb4c6270a5fec3d90d90390c2241dae01e0d1a68f46"


def sources() -> list[str]:
    return [pinned.method_source(*h) for h in HOOKED]


def check_version() -> None:
    pinned.check("update-gate extension", "BasePPOTrainer.train_step and _compute_rollout_stats", sources(),
                 FINGERPRINT, "train with askspec's own trainer")


def used(settings: dict[str, Any]) -> bool:
    """Whether a job's `extension` installs the step hook: an update gate, or askspec's
    advantages (whose dropped members can leave a step without a loss token)."""
    from . import advantages

    return bool(settings.get("update_gate")) or advantages.used(settings)


# what the local trainer records for a step without a loss token (runtime/train/policy.py)
NO_TOKENS = ("no_tokens", "no trajectory with a trained token")


def step_lr_schedule(actor: Any) -> float:
    """Run on each of OpenRLHF's PolicyModelActors (Ray's `__ray_call__`): the steps of the
    actor's learning-rate scheduler (the one DeepSpeed's engine steps in `optimizer_step`)
    that one rollout batch's optimizer steps would take (`--train.max_epochs`: askspec's
    schedule counts a step's epochs as one, schedule.py), nothing else; the learning rate
    it sets."""
    from .schedule import epochs_of

    for _ in range(epochs_of(getattr(getattr(actor, "strategy", None), "args", None))):
        actor.actor_scheduler.step()
    return float(actor.actor_scheduler.get_last_lr()[0])


def advance_lr_schedule(actors: Any, ray: Any) -> float | None:
    """A skipped `no_tokens` step counts in the learning-rate schedule, as a local run's
    does (docs/training.md, "Skipped steps": warm-up and cosine decay are over the role's
    steps): OpenRLHF steps the scheduler only in the optimizer step the skip leaves out.
    Through the actor group's own `async_run_method` (OpenRLHF's RayActorGroup); the
    actors' new learning rate."""
    rates = ray.get(actors.async_run_method("__ray_call__", step_lr_schedule))
    return rates[0] if rates else None


def loss_tokens(rollout_samples: list) -> int:
    """The action tokens of a step's rollouts that carry loss: those of rollouts the agent
    trained a turn of (askspec_ext/advantages.py's `members` rule; a dropped, failed or
    unrewarded one has `askspec_trained_turns` 0 and no action range)."""
    total = 0
    for e in rollout_samples:
        turns = e.info.get("askspec_trained_turns")
        for row in range(e.action_mask.shape[0]):
            if turns is None or float(turns.flatten()[row]) > 0:
                total += int(e.action_mask[row].sum())
    return total


class StepGate:
    """The job's gate (job.json beside this package; None without `update_when`) and the
    trainer's run store."""

    def __init__(self, job: Any) -> None:
        from askspec.runtime.targets.openrlhf.jobfile import as_phase_job
        from askspec.runtime.targets.openrlhf.update_gate import JobGate

        self.job = job = as_phase_job(job)
        self.gate = JobGate(job) if job.extension.get("update_gate") else None
        # (the gate has parsed the experiment already)
        self.exp = self.gate.exp if self.gate is not None else job.ir()
        self.role: str = job.trained_role
        # the group std the block's estimator divides by, which `reward_std` is (as the local trainer's)
        self.std = next((t.config.std for t in self.exp.training if t.role == self.role and t.config), "sample")
        self.writer: Any = None
        # (a phase of the RL schedule, whose state carries phase to phase; a stage's PPO job counts its own)
        self.local_steps = local_steps(self.exp, self.role) if job.extension.get("carry_state") else []

    def step(self, global_step: int) -> int:
        """The local run's step number of OpenRLHF's `global_step` (counted from 0 in each
        launch): in a phase of an alternating schedule, the step the local schedule plays
        there (ASKSPEC_ITERATION, which driver.sh sets, names the iteration), so that
        `update_when`'s `step` and the trainer's `train_steps.step` are the local run's; past
        the local steps (a job rounded up to whole passes) it counts on."""
        if not self.local_steps:
            return global_step + 1
        if global_step < len(self.local_steps):
            return self.local_steps[global_step]
        return self.local_steps[-1] + global_step - len(self.local_steps) + 1

    def record(self, step: int, metrics: dict[str, Any]) -> None:
        if self.writer is None:
            from askspec.runtime.targets.openrlhf.adapter import open_job_writer

            self.writer = open_job_writer(self.exp, self.job, pinned.JOB_FILE.parent, self.role, "openrlhf-trainer")
        self.writer.train_step(self.role, step, metrics)
        self.writer.flush()  # the trainer's process ends when the job stops it


ITERATION_ENV = "ASKSPEC_ITERATION"  # the iteration of the alternating schedule a phase's launch plays


def local_steps(exp: Any, role: str) -> list[int]:
    """The local step numbers of `role`'s phase in the iteration this launch plays (an
    alternating schedule; empty otherwise: OpenRLHF's count is the local one)."""
    import os

    if exp.schedule is None or exp.schedule.kind != "alternating":
        return []
    from askspec.runtime.targets.openrlhf.phase_data import phase_steps

    return phase_steps(exp, role, int(os.environ.get(ITERATION_ENV) or 1))


def _rewards(rollout_samples: list, std: str) -> dict[str, Any]:
    """What the step's rollouts were rewarded (the local trainer's batch_reward_stats: the
    mean over trajectories and their std, sample or population as the block's `std`)."""
    from askspec.ir.advantages import group_std

    values = [float(r) for e in rollout_samples if e.rewards is not None for r in e.rewards.flatten().tolist()]
    if not values:
        return {"trajectories": 0, "reward_mean": None, "reward_std": None}
    return {"trajectories": len(values), "reward_mean": sum(values) / len(values),
            "reward_std": group_std(values, std)}


def install(module: Any = None, job: Any = None) -> None:
    """Skip OpenRLHF's training step without a loss token, and gate it on the job's
    update_when when it has one (idempotent)."""
    module = module or importlib.import_module(MODULE)
    if getattr(getattr(module, "BasePPOTrainer", None), "_askspec_gate", None) is not None:
        return
    check_version()  # before BasePPOTrainer is looked up: another release may not have it
    cls = module.BasePPOTrainer
    if job is None:
        from askspec.runtime.targets.openrlhf.jobfile import read_phase_job

        job = read_phase_job(pinned.JOB_FILE)
    state = StepGate(job)
    original = cls.train_step

    def train_step(self, rollout_samples, global_step: int):
        step = state.step(global_step)  # the local step this batch is (fit counts from 0 in each launch)
        seen: dict[str, Any] = {"step": step, **_rewards(rollout_samples, state.std)}
        tokens = loss_tokens(rollout_samples)
        skip: tuple[str, str] | None = None
        gated: dict[str, Any] = {}
        if state.gate is not None:  # the local trainer asks the gate first, then counts the batch's tokens
            sessions = state.gate.sessions(label for e in rollout_samples for label in e.labels)
            seen["sessions"] = len(sessions)
            closed = state.gate.closed(sessions, step)
            gated = {"gate": closed is None}
            if closed is not None:
                skip = ("gate", closed)
        if skip is None and tokens == 0:
            skip = NO_TOKENS
        if skip is None:
            status, after = original(self, rollout_samples, global_step)
            if state.gate is not None:
                status["askspec/gate"] = 1.0
            state.record(step, {**seen, **gated, "tokens": tokens, "loss": status.get("policy_loss"),
                                "grad_norm": status.get("actor_grad_norm"), "lr": status.get("actor_lr")})
            return status, after
        # no forward, backward or optimizer step; OpenRLHF's own statistics of the batch
        status = self._compute_rollout_stats(rollout_samples)
        status["askspec/skipped"] = 1.0
        if state.gate is not None:
            status["askspec/gate"] = 1.0 if gated["gate"] else 0.0
        lr = {}
        if skip == NO_TOKENS:  # reached the update: the schedule counts it (a gated step counts in neither)
            lr = {"lr": advance_lr_schedule(self.actor_model_group, module.ray)}
        state.record(step, {**seen, **gated, "skipped": skip[0], "skip_reason": skip[1], "tokens": 0, **lr})
        return status, global_step + 1

    train_step.__wrapped__ = original  # type: ignore[attr-defined]
    cls.train_step = train_step
    cls._askspec_gate = state


def install_when_loaded() -> None:
    pinned.install_when_loaded(MODULE, install)
