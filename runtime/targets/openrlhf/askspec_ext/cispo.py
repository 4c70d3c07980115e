"""CISPO as an OpenRLHF 0.11.2 policy loss: `--actor.policy_loss_type cispo`.

    loss_t = −sg(clip(r_t, 1 − ε_low, 1 + ε_high)) · A_t · log π(a_t)

with r_t = exp(log π − log π_old) and ε_low/ε_high from `--actor.eps_clip_low_high` (the
spec's `cispo(clip_low = .., clip_high = ..)`): the weight is detached, so a clipped
token still passes gradient through log π (MiniMax-M1), as askspec's own trainer computes
it (askspec.runtime.train.losses). Aggregation, data-parallel scaling and the logged
statistics are OpenRLHF's own (`aggregate_loss`, `masked_mean`).

Asynchronous rollouts (the spec's `max_staleness`: `--algo.advantage.is_correction_level
token --algo.advantage.is_correction_mode clip --algo.advantage.is_correction_threshold 0
is_bound`): each token's loss is multiplied by OpenRLHF's truncated importance weight
w_t = clip(π_old / μ, low, high), μ the sampler's (vLLM's) log-prob of the token, as its
ppo loss does and as askspec's trainer weights a stale rollout (w = min(π_old / μ,
is_bound)); the ratio r_t stays against π_old. Other correction levels, modes and gatings
are refused.

`install()` wraps `PolicyLoss.__init__` and `PolicyLoss.forward` (every other loss type
goes to OpenRLHF's code unchanged); `install_when_loaded()`, the Ray workers' setup hook,
does it once a worker imports `openrlhf.models.loss`; `parser_accepts_cispo()` adds
`cispo` to the choices of train_ppo_ray's `--actor.policy_loss_type`. Both refuse to run on any OpenRLHF whose
hooked code is not 0.11.2's (a version and a fingerprint of that code). This module needs
only torch and OpenRLHF: it is copied into every job folder that trains with CISPO.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Iterator

from . import pinned
from .pinned import WRITTEN_FOR, VersionMismatch

# sha256 of the hooked code as OpenRLHF 0.11.2 ships it (`fingerprint()`)
FINGERPRINT = "ba21a1a7a45669e2c12d64d1e49eabbbae1c80dca2f72a879b8be96460eb1b35"
POLICY_LOSS_FLAG = "--actor.policy_loss_type"
NAME = "cispo"
LOSS_MODULE = "openrlhf.models.loss"


def _hooked_sources() -> list[str]:
    """The code the extension depends on: PolicyLoss's constructor and forward, the parser
    line of --actor.policy_loss_type, train()'s ray.init call (train_ppo_ray adds the
    worker setup hook to it), the trainer's PolicyLoss(...) call and its call of the loss
    (which hands it the sampler's log-probs and reads the correction's statistics)."""
    loss = importlib.import_module(LOSS_MODULE)
    # once installed, the class holds our wrappers: fingerprint the functions they wrap
    init, forward = getattr(loss.PolicyLoss, "_askspec_wrapped", (loss.PolicyLoss.__init__, loss.PolicyLoss.forward))
    sources = [inspect.getsource(init), inspect.getsource(forward)]
    package = Path(inspect.getfile(loss)).parents[1]  # read, not imported: both modules import ray at top
    for rel, pattern in (("cli/train_ppo_ray.py", r'parser\.add_argument\("--actor\.policy_loss_type".*'),
                         ("cli/train_ppo_ray.py", r"if not ray\.is_initialized\(\):(?s:.*?)\n    \w"),
                         ("trainer/ray/ppo_actor.py", r"self\.actor_loss_fn = PolicyLoss\((?s:.*?)\n\s*\)"),
                         ("trainer/ray/ppo_actor.py", r"\w+(?:, \w+)* = self\.actor_loss_fn\((?s:.*?)\n\s*\)")):
        path = package / rel
        found = re.search(pattern, path.read_text(encoding="utf-8")) if path.exists() else None
        sources.append(found.group(0) if found else f"<{rel}: not found>")
    return sources


def fingerprint() -> str:
    return hashlib.sha256("\0".join(_hooked_sources()).encode("utf-8")).hexdigest()


def check_version() -> None:
    """Raise VersionMismatch unless the installed OpenRLHF is the one this was written for:
    its version first, read from its metadata (nothing of OpenRLHF imported), then the
    fingerprint of the hooked code (a PolicyLoss that is not there: a changed install)."""
    pinned.check("CISPO extension", f"openrlhf.models.loss.PolicyLoss and train_ppo_ray's {POLICY_LOSS_FLAG} and "
                 f"ray.init", _hooked_sources, FINGERPRINT, "recompile the job with `--substitute cispo=grpo`")


def install() -> None:
    """Add `cispo` to OpenRLHF's PolicyLoss (idempotent). Run in every process that builds
    one: the job's entry point and (install_when_loaded) every Ray worker that imports it."""
    loss = sys.modules.get(LOSS_MODULE)
    if getattr(getattr(loss, "PolicyLoss", None), "_askspec_wrapped", None) is not None:
        return
    check_version()  # before PolicyLoss is looked up: another release may not have it
    loss = importlib.import_module(LOSS_MODULE)
    cls = loss.PolicyLoss
    if getattr(cls, "_askspec_wrapped", None) is not None:
        return
    original_init, original_forward = cls.__init__, cls.forward

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if self.policy_loss_type == NAME:
            if self.dual_clip is not None:
                raise ValueError("--actor.dual_clip does not apply to cispo (its weight is clipped on both sides "
                                 "already): leave it out")
            # the one correction askspec compiles (max_staleness): OpenRLHF's token-level TIS
            tis = ("token", "clip", "ratio")
            used = (self.is_correction_level, self.is_correction_mode, self.is_correction_gating)
            if self.is_correction_level != "off" and used != tis:
                raise ValueError("askspec's CISPO extension implements OpenRLHF's token-level TIS only "
                                 "(--algo.advantage.is_correction_level token --algo.advantage.is_correction_mode "
                                 "clip --algo.advantage.is_correction_gating ratio, as `max_staleness` compiles), "
                                 f"not level {used[0]}, mode {used[1]}, gating {used[2]}: use those, leave the "
                                 "correction off, or train with grpo")

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, dp_size=1,
                batch_num_tokens=None, global_batch_size=None):
        if self.policy_loss_type != NAME:
            return original_forward(self, log_probs, old_log_probs, advantages, action_mask=action_mask,
                                    rollout_log_probs=rollout_log_probs, dp_size=dp_size,
                                    batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
        log_ratio = log_probs - old_log_probs
        ratio = log_ratio.clamp(min=-20.0, max=20.0).exp()
        low, high = 1 - self.clip_eps_low, 1 + self.clip_eps_high
        weight = ratio.clamp(low, high).detach()
        token_loss = -weight * advantages * log_probs
        vllm_kl = is_filter_ratio = None
        if self.is_correction_level != "off":
            if rollout_log_probs is None:
                raise ValueError("--algo.advantage.is_correction_level token with cispo needs the sampler's "
                                 "log-probs (the experience's rollout_log_probs), and none came with this batch")
            is_low, is_high = self.is_correction_threshold
            # π_old / μ per token, its log clamped as askspec's importance_weights does
            is_ratio = (old_log_probs - rollout_log_probs).detach().clamp(min=-20.0, max=20.0).exp()
            token_loss = is_ratio.clamp(min=is_low, max=is_high) * token_loss
            truncated = (is_ratio < is_low) | (is_ratio > is_high)
            is_filter_ratio = loss.masked_mean(truncated.float(), action_mask, dim=None)
            vllm_kl = loss.masked_mean(rollout_log_probs - old_log_probs, action_mask, dim=None)
        total = loss.aggregate_loss(token_loss, action_mask, token_level_loss=self.token_level_loss, dp_size=dp_size,
                                    batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
        clip_ratio = loss.masked_mean(((ratio < low) | (ratio > high)).float(), action_mask, dim=None)
        ppo_kl = loss.masked_mean(-log_ratio.detach(), action_mask, dim=None)
        return total, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio

    cls.__init__ = __init__
    cls.forward = forward
    cls._askspec_wrapped = (original_init, original_forward)


def install_when_loaded() -> None:
    """The Ray workers' setup hook for the loss: install() now if this process has imported
    openrlhf.models.loss, else right after it does. A worker that never builds a PolicyLoss
    (a vLLM engine, which OpenRLHF keeps free of DeepSpeed) imports nothing for it."""
    pinned.install_when_loaded(LOSS_MODULE, install)


@contextlib.contextmanager
def parser_accepts_cispo() -> Iterator[None]:
    """While open, an ArgumentParser's `--actor.policy_loss_type` also accepts `cispo`
    (train_ppo_ray builds its parser inside its `__main__` block, so there is no parser
    object to change from outside)."""
    check_version()
    cls = argparse.ArgumentParser
    had = "add_argument" in cls.__dict__
    previous = cls.add_argument

    def add_argument(self, *args: Any, **kwargs: Any):
        if POLICY_LOSS_FLAG in args and NAME not in kwargs.get("choices", [NAME]):
            kwargs["choices"] = [*kwargs["choices"], NAME]
        return previous(self, *args, **kwargs)

    cls.add_argument = add_argument  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had:
            cls.add_argument = previous  # type: ignore[method-assign]
        else:
            del cls.add_argument
