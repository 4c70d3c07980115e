"""What `askspec run` shows of training: one line per trained role and step as the step
ends (its `train_steps` record in words), and the closing lines per role: first and last
reward mean, the steps whose update did not run and why, and a warning when most steps
had no learning signal (docs/training.md, "Watching a run")."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from askspec.terminal import printable

# a step "had no signal" when every trajectory's advantage was 0 (all groups had equal
# rewards): its update was skipped, or ran on a KL term alone
NO_SIGNAL_SKIPS = frozenset({"zero_advantage"})


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None else format(float(v), fmt)


def _share(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.0f}%"


def step_line(role: str, step: int, total: int, m: dict[str, Any]) -> str:
    """One step of one role, e.g. `step 2/16 online asker: reward 0.250 ± 0.433  zero-adv
    50%  loss 0.0123  kl 0  grad 1.23  clip 0%  tokens 412  rollout 70.1 s  update 8.2 s`."""
    where = m.get("stage") or m.get("phase") or ""
    text = (f"step {step}/{total} {where} {role}: reward {_num(m.get('reward_mean'), '.3f')} "
            f"± {_num(m.get('reward_std'), '.3f')}  zero-adv {_share(m.get('zero_adv_share'))}  "
            f"loss {_num(m.get('loss'), '.4g')}  kl {_num(m.get('kl'), '.4g')}  grad {_num(m.get('grad_norm'), '.3g')}  "
            f"clip {_share(m.get('clip_frac'))}  tokens {int(m.get('generated_tokens') or m.get('tokens') or 0):,}  "
            f"rollout {float(m.get('seconds_play') or 0.0):.1f} s  update {float(m.get('seconds_update') or 0.0):.2f} s")
    if m.get("skipped"):
        text += f"  skipped: {m['skipped']}"
    return printable(text, single_line=True)  # role and stage names come from the spec


@dataclass
class _RoleRecord:
    steps: int = 0
    first: tuple[int, float] | None = None  # (step, reward mean) of the first step with rewards
    last: tuple[int, float] | None = None
    skipped: Counter = field(default_factory=Counter)
    no_signal: int = 0
    alone: int = 0  # of those, steps whose every group had one trajectory (no group to compare within)


class TrainReport:
    """Collects the steps this process trained (`on_step`) for the closing lines."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.roles: dict[str, _RoleRecord] = {}

    def step(self, step: int, metrics: dict[str, dict[str, Any]]) -> list[str]:
        """Record a step's metrics per role; returns its console lines."""
        lines = []
        for role, m in metrics.items():
            rec = self.roles.setdefault(role, _RoleRecord())
            rec.steps += 1
            if m.get("reward_mean") is not None:
                point = (step, float(m["reward_mean"]))
                rec.first = rec.first or point
                rec.last = point
            if m.get("skipped"):
                rec.skipped[str(m["skipped"])] += 1
            if m.get("skipped") in NO_SIGNAL_SKIPS or (m.get("trajectories") and m.get("zero_adv_share") == 1.0):
                rec.no_signal += 1
                rec.alone += int(m.get("groups") == m.get("trajectories") and not m.get("zero_var_groups"))
            lines.append(step_line(role, step, self.total, m))
        return lines

    def summary(self) -> list[str]:
        """Per role: reward mean first -> last, steps skipped by reason."""
        lines = []
        for role, rec in self.roles.items():
            reward = "no rewards"
            if rec.first is not None and rec.last is not None:
                reward = f"reward mean {rec.first[1]:.3f} (step {rec.first[0]}) -> {rec.last[1]:.3f} (step {rec.last[0]})"
            skipped = sum(rec.skipped.values())
            why = ", ".join(f"{code} {n}" for code, n in sorted(rec.skipped.items()))
            lines.append(f"  training {role}: {rec.steps} step(s), {reward}; "
                         + (f"{skipped} skipped ({why})" if skipped else "none skipped"))
        return [printable(line, single_line=True) for line in lines]

    def warnings(self) -> list[str]:
        """A warning per role when most of its steps had no signal: every group's rewards
        equal, or (said apart) every group of one trajectory."""
        out = []
        for role, rec in self.roles.items():
            if not rec.no_signal or rec.no_signal * 2 <= rec.steps:
                continue
            if rec.alone == rec.no_signal:
                why = ("every group had one trajectory — no gradient; set `group` in the train block (e.g. group = 4) "
                       "so that each prompt's rollouts are compared")
            else:
                why = "every group had equal rewards — no gradient; widen the reward or the group"
            out.append(printable(f"{role}: {rec.no_signal} of {rec.steps} steps: {why}", single_line=True))
        return out
