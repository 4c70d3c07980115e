"""`std = population` on OpenRLHF 0.11.2: group_norm advantages divided by the population
std of each prompt's group (Reasoning Arena's Eq. 2), where OpenRLHF's divide by
`torch.std`, the sample std (n − 1).

Every group of an OpenRLHF batch has the same size, n = --rollout.n_samples_per_prompt,
and its sample std is √(n / (n − 1)) times its population std. So the hook runs
OpenRLHF's own `RemoteExperienceMaker.compute_advantages_and_returns` (length penalties,
group statistics, per-token returns, its logging) and multiplies what its group_norm
produced by √(n / (n − 1)):

    A = (r − μ_G) / (σ_G,sample + 1e-9) · √(n / (n − 1)) = (r − μ_G) / (σ_G,population + ε′)

with ε′ = 1e-9 · √((n − 1) / n), as askspec's own trainer computes group_norm with
`std = population` (askspec.runtime.train.advantages) up to that ε. Every per-token value
is the group-normalised reward itself only while the KL penalty is not in the reward
(it would be scaled too): with `kl > 0` the job passes `--algo.kl.use_loss`, and the
hook refuses the other case. Other estimators are OpenRLHF's unchanged (only group_norm
divides by a std). The logged `group_reward_std` stays OpenRLHF's (the sample std).

`install()` wraps the method (once); `install_when_loaded()` is the Ray workers' hook
(the PPO trainer actor makes the experiences). Both refuse an OpenRLHF whose hooked code
is not 0.11.2's. Needs only torch and OpenRLHF."""

from __future__ import annotations

import importlib
import math
from typing import Any

from . import pinned

MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
HOOKED = ("trainer/ppo_utils/experience_maker.py", "RemoteExperienceMaker", "compute_advantages_and_returns")
# sha256 of the hooked method as OpenRLHF 0.11.2 ships it (pinned.fingerprint(sources()))
FINGERPRINT = "edee114b74af1e792960f911d528043b286ff660ba28df78073a7300d1385c25"
POPULATION = "population"


def sources() -> list[str]:
    return [pinned.method_source(*HOOKED)]


def check_version() -> None:
    pinned.check("population-std extension", "RemoteExperienceMaker.compute_advantages_and_returns", sources(),
                 FINGERPRINT, "train with `std = sample` (OpenRLHF's own)")


def scale(n: int) -> float:
    """Population over sample advantages for groups of n: √(n / (n − 1)); 1 for n < 2."""
    return math.sqrt(n / (n - 1)) if n > 1 else 1.0


def install(module: Any = None) -> None:
    """Make group_norm divide by the population std (idempotent)."""
    module = module or importlib.import_module(MODULE)
    cls = module.RemoteExperienceMaker
    if getattr(cls, "_askspec_population_std", None) is not None:
        return
    check_version()
    original = cls.compute_advantages_and_returns

    def compute_advantages_and_returns(self, experiences):
        args = self.strategy.args
        if args.algo.advantage.estimator != "group_norm":
            return original(self, experiences)
        if not args.algo.kl.use_loss and args.algo.kl.init_coef > 0:
            raise ValueError("askspec's population-std extension scales the group_norm returns, which would scale a "
                             "KL penalty in the reward too: pass --algo.kl.use_loss (askspec's launch.sh does)")
        experiences = original(self, experiences)
        k = scale(args.rollout.n_samples_per_prompt)
        for e in experiences:
            e.advantages = e.advantages * k
            e.returns = e.returns * k
            if "return" in e.info:
                e.info["return"] = e.info["return"] * k
        return experiences

    compute_advantages_and_returns.__wrapped__ = original  # type: ignore[attr-defined]
    cls.compute_advantages_and_returns = compute_advantages_and_returns
    cls._askspec_population_std = original


def install_when_loaded() -> None:
    pinned.install_when_loaded(MODULE, install)
