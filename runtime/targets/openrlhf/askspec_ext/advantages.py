"""askspec's advantages on OpenRLHF 0.11.2: every RL job whose estimator is not gae gives
each rollout the advantage askspec's own trainer would (the block's estimator, its `std`,
sample or population (Reasoning Arena's Eq. 2), and its ε: grpo's 1e-4, where OpenRLHF's
group_norm adds 1e-9), over askspec's groups: a prompt's n rollouts
(--rollout.n_samples_per_prompt), less those the local trainer's batch leaves out (a
rollout the agent trained no turn of, `askspec_trained_turns` 0: a dropped, failed or
unrewarded one, or one with no loss token), which get 0.

The hook replaces OpenRLHF's `RemoteExperienceMaker.compute_advantages_and_returns` for
those estimators: OpenRLHF's own reward precision and length penalties
(`apply_length_penalties`), then askspec's advantage per rollout (the local trainer's
function, askspec.runtime.train.advantages, the reinforce estimators' token-weighted batch
whitening included), placed on the tokens by OpenRLHF's own `compute_reward` and
`get_cumulative_returns` (γ = 1). The value on every token is the rollout's advantage only
while the KL penalty is not in the reward: with `kl > 0` the job passes
`--algo.kl.use_loss`, and the hook refuses the other case. gae (ppo) is OpenRLHF's
unchanged. The logged `group_reward_std` is askspec's, over the members its group counts.

`install()` wraps the method (once); `install_when_loaded()` is the Ray workers' hook
(the PPO trainer actor makes the experiences). Both refuse an OpenRLHF whose hooked code
is not 0.11.2's. Needs torch, OpenRLHF and askspec (installed on every node for the
agent)."""

from __future__ import annotations

import importlib
from typing import Any

from askspec.ir.advantages import group_std

from . import pinned

MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
HOOKED = ("trainer/ppo_utils/experience_maker.py", "RemoteExperienceMaker", "compute_advantages_and_returns")
# sha256 of the hooked method as OpenRLHF 0.11.2 ships it (pinned.fingerprint(sources()))
FINGERPRINT = "edee114b74af1e792960f911d528043b286ff660ba28df78073a7300d1385c25"
POPULATION = "population"


def sources() -> list[str]:
    return [pinned.method_source(*HOOKED)]


def check_version() -> None:
    pinned.check("advantages extension", "RemoteExperienceMaker.compute_advantages_and_returns", sources(),
                 FINGERPRINT, "train with askspec's own trainer")


def used(settings: dict[str, Any]) -> bool:
    """Whether a job's `extension` asks for the hook (`advantages`; `advantage_std` in jobs
    compiled before every RL job shipped it)."""
    return bool(settings.get("advantages")) or settings.get("advantage_std") == POPULATION


def members(experiences: list) -> dict[int, bool]:
    """Per rollout (its place in prompt order): whether it counts in its group, as the local
    trainer's batch (runtime/train/batch.py) counts it: a rollout the agent returned without
    an action range (an error session, a dropped or failed group, `drop ROLE`, every turn
    dropped, no reward: `askspec_trained_turns` 0) or with no loss token left is not one."""
    out: dict[int, bool] = {}
    for e in experiences:
        turns = e.info.get("askspec_trained_turns")
        for row, i in enumerate(e.index):
            trained = turns is None or float(turns.flatten()[row]) > 0
            out[int(i)] = trained and bool(e.action_mask[row].sum() > 0)
    return out


def askspec_advantages(experiences: list, n: int, estimator: str, std: str,
                       counted: dict[int, bool] | None = None) -> dict[int, float]:
    """Each rollout's advantage (its place in prompt order -> value) by askspec's estimator
    over askspec's groups: the rollouts of a prompt (n consecutive places) that count
    (`members`); the others get 0. The local trainer's own function computes them
    (askspec.runtime.train.advantages, askspec.ir.advantages's formulas, the same std and
    ε), token-weighted whitening included."""
    import torch

    from askspec.runtime.train.advantages import advantages

    counted = members(experiences) if counted is None else counted
    reward: dict[int, float] = {}
    tokens: dict[int, float] = {}
    for e in experiences:
        for row, i in enumerate(e.index):
            reward[int(i)] = float(e.rewards[row])
            tokens[int(i)] = float(e.action_mask[row].sum())
    kept = sorted(i for i, ok in counted.items() if ok)
    out = {i: 0.0 for i in counted}
    if not kept:
        return out
    group_of = {g: k for k, g in enumerate(dict.fromkeys(i // n for i in kept))}
    values = advantages(estimator, torch.tensor([reward[i] for i in kept], dtype=torch.float64),
                        torch.tensor([group_of[i // n] for i in kept], dtype=torch.long),
                        torch.tensor([tokens[i] for i in kept], dtype=torch.float64), std)
    out.update({i: float(v) for i, v in zip(kept, values.tolist())})
    return out


def _group_std(experiences: list, counted: dict[int, bool], group: int, n: int, std: str) -> float:
    rewards = [float(e.rewards[row]) for e in experiences for row, i in enumerate(e.index)
               if int(i) // n == group and counted[int(i)]]
    return group_std(rewards, std)


def install(module: Any = None, settings: dict[str, Any] | None = None) -> None:
    """Make OpenRLHF's advantages askspec's (idempotent): `settings` is job.json's
    `extension.advantages` ({"estimator", "std"}; default the job's)."""
    module = module or importlib.import_module(MODULE)
    if getattr(getattr(module, "RemoteExperienceMaker", None), "_askspec_population_std", None) is not None:
        return
    check_version()  # before RemoteExperienceMaker is looked up: another release may not have it
    if settings is None:
        job = pinned.job_settings()
        settings = job.get("advantages") or {"estimator": "group_norm", "std": job.get("advantage_std", "sample")}
    estimator, std = str(settings["estimator"]), str(settings.get("std", "sample"))
    cls = module.RemoteExperienceMaker
    original = cls.compute_advantages_and_returns

    def compute_advantages_and_returns(self, experiences):
        """OpenRLHF 0.11.2's method with askspec's group step: its reward precision and length
        penalties, then askspec's advantage per rollout (`askspec_advantages`), as its own
        group estimators place one on the tokens (`compute_reward`, `get_cumulative_returns`,
        γ = 1); the batch whitening of the reinforce estimators is already in that value."""
        import torch

        args = self.strategy.args
        if args.algo.advantage.estimator == "gae":
            return original(self, experiences)
        if not args.algo.kl.use_loss and args.algo.kl.init_coef > 0:
            raise ValueError("askspec's advantage extension gives each rollout its askspec advantage, which a KL "
                             "penalty in the reward would change: pass --algo.kl.use_loss (askspec's launch.sh does)")
        for e in experiences:
            e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
        module.apply_length_penalties(experiences, args)
        n = args.rollout.n_samples_per_prompt
        counted = members(experiences)
        values = askspec_advantages(experiences, n, estimator, std, counted)
        for e in experiences:
            if n > 1:  # the logged group std: askspec's, over the members its group counts
                e.info["group_reward_std"] = torch.tensor([_group_std(experiences, counted, int(i) // n, n, std)
                                                           for i in e.index])
            adv = torch.tensor([values[int(i)] for i in e.index], dtype=e.rewards.dtype)
            reward = module.compute_reward(adv, self.kl_ctl.value, e.kl, action_mask=e.action_mask,
                                           reward_clip_range=args.reward.clip_range)
            e.returns = self.get_cumulative_returns(reward, e.action_mask, 1.0)
            e.advantages = e.returns.clone()
            e.info["return"] = reward.sum(dim=-1)
            e.kl = None
        return experiences

    compute_advantages_and_returns.__wrapped__ = original  # type: ignore[attr-defined]
    cls.compute_advantages_and_returns = compute_advantages_and_returns
    cls._askspec_population_std = original


def install_when_loaded() -> None:
    pinned.install_when_loaded(MODULE, install)
