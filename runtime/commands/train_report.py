"""What `askspec run` shows of training: one line per trained role and step as the step
ends (its `train_steps` record in words, and the spec's declared metrics over the step's
sessions), and the closing lines per role: first and last reward mean, the steps whose
update did not run and why, and a warning when most steps had no learning signal; the
closing `trained ...` line; and, before the run, what its checkpoints will hold on disk
when that is a lot (docs/training.md, "Watching a run")."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from askspec.ir import model as ir
from askspec.terminal import printable

from askspec.runtime.engine.recorder import Recorder

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
            f"clip {_share(m.get('clip_frac'))}  {_mismatch(m)}"
            f"tokens {int(m.get('generated_tokens') or m.get('tokens') or 0):,}  "
            f"rollout {float(m.get('seconds_play') or 0.0):.1f} s  update {float(m.get('seconds_update') or 0.0):.2f} s")
    if m.get("skipped"):
        text += f"  skipped: {m['skipped']}"
    return printable(text, single_line=True)  # role and stage names come from the spec


def _mismatch(m: dict[str, Any]) -> str:
    """`mis 1.2e-03  `: the KL between the sampler's and the trainer's log-probabilities of
    the step's on-policy tokens (train_steps.mismatch_kl), when the step has one."""
    v = m.get("mismatch_kl")
    if v is None:
        return ""
    return f"mis {float(v):.1e}{' (> max_mismatch)' if m.get('mismatch_warning') else ''}  "


DECLARED_SHOWN = 8  # declared metric values on a step's line; more are counted ("+3 more")


def declared_words(rows: list[dict[str, Any]]) -> str:
    """The spec's declared metrics over one step's sessions (engine/metrics.py's rows), for
    the step's line: `solve_rate 0.75  acc[variant=a] 0.5` (`-`: no session gave a value)."""
    words = []
    for row in rows[:DECLARED_SHOWN]:
        by = ",".join(f"{k}={v}" for k, v in row["by"].items())
        value = row["value"]
        if row.get("n") == 0 or value is None:
            shown = "-"
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            shown = "error" if isinstance(value, str) and value.startswith("error:") else str(value)[:24]
        else:
            shown = format(value, ".3g") if isinstance(value, float) else str(value)
        words.append(f"{row['metric']}{f'[{by}]' if by else ''} {shown}")
    if len(rows) > DECLARED_SHOWN:
        words.append(f"+{len(rows) - DECLARED_SHOWN} more")
    return printable("  ".join(words), single_line=True)


class StepSessions:
    """The run's recorder, passed through (the engine's writer in a training run), keeping
    each training step's sessions as the store records them (variables, bindings, rewards,
    groups), so that the spec's declared metrics are evaluated over one step's sessions
    when it ends, as `askspec metrics` evaluates them over a run's."""

    def __init__(self, writer: Recorder, exp: ir.Experiment) -> None:
        self._writer = writer
        self._exp = exp
        self._sessions: dict[str, dict[str, Any]] = {}  # session -> what it recorded (its step's while it is kept)
        self._groups: dict[str, tuple[Any, ...]] = {}  # group -> (route, stats, members, judge calls)

    # forwarded as they are (the engine's other events)
    def turn(self, session_id: str, attempt: int, **fields: Any) -> None:
        self._writer.turn(session_id, attempt, **fields)

    def match(self, group_id: str, **fields: Any) -> None:
        self._writer.match(group_id, **fields)

    def buffer_event(self, **fields: Any) -> None:
        self._writer.buffer_event(**fields)

    def session_started(self, session_id: str, **fields: Any) -> int:
        attempt = self._writer.session_started(session_id, **fields)
        if fields.get("step") is not None:
            self._sessions[session_id] = {**fields, "params": _as_stored(fields.get("params") or {}), "named": []}
        return attempt

    def reward(self, session_id: str, attempt: int, **fields: Any) -> None:
        self._writer.reward(session_id, attempt, **fields)
        rec = self._sessions.get(session_id)
        if rec is not None:
            rec["named"].append((fields["role"], fields.get("turn_index"), fields["name"], float(fields["value"])))

    def session_finished(self, session_id: str, attempt: int, **fields: Any) -> None:
        self._writer.session_finished(session_id, attempt, **fields)
        rec = self._sessions.get(session_id)
        if rec is not None:
            rec.update(status=fields.get("status"), outcome=fields.get("outcome"),
                       vars=_as_stored(fields.get("vars") or {}))

    def group(self, group_id: str, **fields: Any) -> None:
        self._writer.group(group_id, **fields)
        if any(m in self._sessions for m in fields.get("members") or ()):
            self._groups[group_id] = (fields.get("route"), fields.get("stats"), list(fields.get("members") or ()),
                                      fields.get("judge_calls"))

    def metrics(self, step: int) -> list[dict[str, Any]]:
        """The declared metrics over step `step`'s ok sessions (engine/metrics.py's rows; none
        when the spec declares no metric); the step's sessions are forgotten."""
        from askspec.runtime.engine.metrics import evaluate_metrics, group_values, session_scope

        mine = {sid: rec for sid, rec in self._sessions.items() if rec.get("step") == step}
        for sid in mine:
            del self._sessions[sid]
        groups: dict[str, dict[str, Any]] = {}
        for gid in [g for g, (_, _, members, _) in self._groups.items() if any(m in mine for m in members)]:
            route, stats, members, calls = self._groups.pop(gid)
            values = group_values(route, stats, members, calls, lambda sid: mine[sid]["named"] if sid in mine else [])
            groups.update({sid: v for sid, v in values.items() if sid in mine})
        if not self._exp.metrics:
            return []
        scopes = []
        for sid, rec in mine.items():
            if rec.get("status") != "ok":
                continue
            totals: dict[str, float] = {}
            for role, _, _, value in rec["named"]:
                totals[role] = totals.get(role, 0.0) + value
            scopes.append(session_scope(groups.get(sid, {}), rec.get("vars") or {}, rec["params"], step=step,
                                        stage=rec.get("stage"), weights=rec.get("weights"), outcome=rec.get("outcome"),
                                        status="ok", game=rec.get("game") or "", rewards=totals,
                                        group_id=rec.get("group_id")))
        return evaluate_metrics(self._exp, scopes)


def _as_stored(value: dict[str, Any]) -> dict[str, Any]:
    """A recorded dict as the store gives it back (JSON: tuples as lists, odd values as text)."""
    out = json.loads(json.dumps(value, default=str))
    return out if isinstance(out, dict) else {}


@dataclass
class _RoleRecord:
    steps: int = 0
    first: tuple[int, float] | None = None  # (step, reward mean) of the first step with rewards
    last: tuple[int, float] | None = None
    skipped: Counter = field(default_factory=Counter)
    no_signal: int = 0
    alone: int = 0  # of those, steps whose every group had one trajectory (no group to compare within)
    mismatched: list[str] = field(default_factory=list)  # the steps' metrics.mismatch_warning


class TrainReport:
    """Collects the steps this process trained (`on_step`) for the closing lines."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.roles: dict[str, _RoleRecord] = {}

    def step(self, step: int, metrics: dict[str, dict[str, Any]],
             declared: list[dict[str, Any]] | None = None) -> list[str]:
        """Record a step's metrics per role; returns its console lines, the last one ending
        with the spec's declared metrics over the step's sessions (`declared`)."""
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
            if m.get("mismatch_warning"):
                rec.mismatched.append(str(m["mismatch_warning"]))
            if m.get("skipped") in NO_SIGNAL_SKIPS or (m.get("trajectories") and m.get("zero_adv_share") == 1.0):
                rec.no_signal += 1
                rec.alone += int(m.get("groups") == m.get("trajectories") and not m.get("zero_var_groups"))
            lines.append(step_line(role, step, self.total, m))
        if lines and declared:
            lines[-1] += "  | " + declared_words(declared)
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
        for role, rec in self.roles.items():
            if rec.mismatched:  # the sampler did not play the trained weights (docs/training.md)
                out.append(printable(f"{role}: {len(rec.mismatched)} of {rec.steps} steps past max_mismatch; "
                                     f"the first: {rec.mismatched[0]}", single_line=True))
        return out

    def counts(self) -> dict[str, Counter]:
        """Per role, this process's steps by skip code (None: the update ran)."""
        return {role: Counter({None: rec.steps - sum(rec.skipped.values()), **rec.skipped})
                for role, rec in self.roles.items()}


def _steps(n: int) -> str:
    return f"{n:,} step" + ("" if n == 1 else "s")


def trained_line(roles: list[str], counts: dict[str, Counter]) -> str:
    """What the run trained and what it skipped, per trained role, from its train_steps
    (`counts`: role -> steps by `skipped` code, None for an update that ran):
    `trained proposer for 2 steps; solver: 4 steps, all skipped (gate)`."""
    trained, idle = [], []
    for role in roles:
        c = counts.get(role, Counter())
        total, ran = sum(c.values()), c.get(None, 0)
        skips = sorted((code, n) for code, n in c.items() if code is not None and n)
        why = ", ".join(f"{code} {n:,}" for code, n in skips)
        if total == 0:
            idle.append(f"{role}: no step")
        elif ran == 0:
            idle.append(f"{role}: {_steps(total)}, all skipped ({skips[0][0] if len(skips) == 1 else why})")
        elif ran == total:
            trained.append(f"{role} for {_steps(ran)}")
        else:
            trained.append(f"{role} for {ran:,} of {_steps(total)} ({total - ran:,} skipped: {why})")
    head = f"trained {', '.join(trained)}" if trained else "trained nothing"
    return printable("; ".join([head, *idle]), single_line=True)


# a run whose checkpoints will hold more than this on disk says so before it starts
CHECKPOINT_NOTE_BYTES = 10**9


def checkpoints_written(steps: int, save_every: int) -> int:
    """Checkpoints a schedule of `steps` steps writes: every `save_every` steps and after
    the last (the trainer's rule, trainer._end_step; a skipped step's included)."""
    return len({s for s in range(save_every, steps + 1, save_every)} | ({steps} if steps > 0 else set()))


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def checkpoint_disk(sizes: dict[str, tuple[int, int]], steps: int, save_every: int,
                    keep: int) -> tuple[int, int, int, int] | None:
    """(checkpoints written, kept, bytes on disk at the end, most bytes while one is written)
    of a schedule, or None when it writes none. `sizes`: per trained role, the bytes of its
    weights and of its AdamW moments. Every checkpoint holds each role's weights; only the
    newest keeps the moments; `keep` of them stay, and while one is written the one before
    still has its moments and the oldest kept is not yet removed (`askspec estimate` too)."""
    written = checkpoints_written(steps, save_every)
    if not written or not sizes:
        return None
    weights = sum(w for w, _ in sizes.values())
    moments = sum(m for _, m in sizes.values())
    kept = min(keep, written)
    return written, kept, kept * weights + moments, min(keep + 1, written) * weights + min(2, written) * moments


def checkpoint_note(sizes: dict[str, tuple[int, int]], steps: int, save_every: int, keep: int,
                    threshold: int = CHECKPOINT_NOTE_BYTES) -> str | None:
    """What the run's checkpoints will hold on disk, when that is over `threshold` bytes,
    else None. `sizes`: per trained role, the bytes of its weights and of its AdamW moments
    (2x the trained weights); the arithmetic is checkpoint_disk's."""
    disk = checkpoint_disk(sizes, steps, save_every, keep)
    if disk is None or disk[3] <= threshold:
        return None
    written, kept, final, peak = disk
    weights = sum(w for w, _ in sizes.values())
    moments = sum(m for _, m in sizes.values())
    return (f"checkpoints: about {_gb(final)} on disk at the end, up to {_gb(peak)} while one is written: "
            f"{written:,} written (save_every = {save_every} over {_steps(steps)}), the newest {kept:,} kept "
            f"(keep_checkpoints = {keep}), each {_gb(weights)} of weights, the newest also {_gb(moments)} of AdamW "
            f"moments; a larger save_every writes fewer, a smaller keep_checkpoints keeps fewer (train block)")


def policy_bytes(policy: Any) -> tuple[int, int] | None:
    """A trained role's (weights, AdamW moments) bytes in a checkpoint: its parameters as
    loaded (the dtype they are saved in; tied weights once), and two moments the size of each
    trained parameter. None when the policy holds no model."""
    model = getattr(policy, "model", None)
    if model is None:
        return None
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = 2 * sum(p.numel() * p.element_size() for p in getattr(policy, "params", ()))
    return weights, moments
