"""The training contract of one trajectory: which rewards it is trained on and which of
its turns carry loss.

A trajectory is one role's conversation in one session (or one reply of a `sample N
ask`). Its scalar return is the sum of the role's terminal rewards in the session and
the per-turn rewards of its own turns; when the session's group was routed to a
tournament or a pointwise judge, the contest's score replaces them (docs/language.md,
"Rewards"). Turns named by `drop` carry no loss, and a trajectory with no reward at all,
or whose group a route dropped, is not trained on.

Every trainer target uses these two functions, so the local trainer and the OpenRLHF
agent (runtime/targets/openrlhf) train on the same numbers (docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# (role, turn index or None for a terminal reward, reward name, value): SessionResult.rewards
RewardRow = tuple[str, "int | None", str, float]


def trajectory_return(rewards: Iterable[RewardRow], role: str, turns: Sequence[int] | None = None,
                      routed: float | None = None) -> float | None:
    """The scalar a trajectory of `role` is trained on, or None when it has no reward.

    `turns` are the trajectory's own turn indexes (None: every turn of the role in the
    session, i.e. the whole conversation); `routed` is the score its group's route gave
    it (a tournament or judge), which replaces the session's rewards."""
    if routed is not None:
        return float(routed)
    own = None if turns is None else set(turns)
    total, seen = 0.0, False
    for r, turn, _name, value in rewards:
        if r != role:
            continue
        if turn is None or own is None or turn in own:
            total += float(value)
            seen = True
    return total if seen else None


def trained_turns(turns: Sequence[int], role: str, dropped: Iterable[dict]) -> list[bool]:
    """For each of the trajectory's `turns` (in order), whether it carries loss: False for
    a turn named by `drop` (a reply or list of replies) or for every turn of a role
    dropped whole (`drop ROLE`). `dropped` is the session's `__dropped__` record."""
    out = [True] * len(turns)
    index = {t: k for k, t in enumerate(turns)}
    for d in dropped:
        if d.get("role") != role:
            continue
        named = d.get("turns")
        if named is None:
            return [False] * len(turns)
        for t in named:
            if t in index:
                out[index[t]] = False
    return out
