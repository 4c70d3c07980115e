"""A training schedule as a flat list of steps: which roles a step updates, which games it
plays, and in which phase and iteration it lies (docs/training.md, "Schedules").

- `online` (the default): one phase; every step plays the games and updates every trained
  role (a role whose `steps` is fewer stops updating after its own steps).
- `alternating`: phases in the schedule's declaration order, `ROLE = N` steps each (only
  ROLE updated; the other roles frozen, still serving their current weights), the whole
  cycle `iterations` times.

Each step has one global number (1, 2, ...): checkpoints, `--resume` and `train_steps`
count in it, so a resumed run re-plays exactly the steps after its checkpoint whatever
phase they lie in.
- `nested` (SOAR): one phase of `outer_steps` outer steps, each playing the outer games
  and updating only the outer role; the step owns its inner loop (copies of the inner
  role trained on the step's datasets, evaluated, promoted or discarded: nested.py), so
  an outer step is checkpointed, resumed and recorded as one step.

Stages (`stage NAME sft|train|evaluate`, in declaration order): an `sft` stage is a phase
of `kind` "sft" (its steps train its role on a data set, no games); the `train` stage is
the cycle above; an `evaluate` stage is one step of `kind` "evaluate" that plays its
games against the trained and the initial weights; a `retrain` stage is a phase of
`kind` "retrain" (its steps train a fresh copy of its role on the items its game plays
over: stages.py). Every phase carries its stage's name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from askspec.ir import model as ir
from askspec.ir.plansize import held_out_games, replays_buffer
from askspec.ir.walk import all_steps


@dataclass(frozen=True)
class Phase:
    name: str  # "online", or the trained role of an alternating phase
    roles: tuple[str, ...]  # roles updated in this phase
    plain: tuple[str, ...]  # games planned from their data (cycling)
    replay: tuple[str, ...]  # games replaying a buffer (a batch of its items per step)
    steps: int
    kind: str = "play"  # play (games, then updates) | sft | evaluate (see the module doc)
    stage: str | None = None  # the stage it belongs to, when the spec declares stages


@dataclass(frozen=True)
class Slot:
    step: int  # global, 1-based
    iteration: int  # 1-based (online: 1)
    phase: Phase
    n: int  # the how-many-th step of this phase's kind (1-based, over all iterations): the data cursor


def asked_roles(steps: list) -> set[str]:
    """Roles a game body asks (any depth)."""
    return {r for s in all_steps(steps) if isinstance(s, ir.AskStep) for r in s.roles}


def phases(exp: ir.Experiment, configs: list) -> tuple[list[Phase], int]:
    """The phases of one cycle and the number of cycles."""
    sched = exp.schedule
    roles = [c.role for c in configs]
    kind = sched.kind if sched is not None else "online"
    opts = sched.options if sched is not None else {}

    def split(names: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        games = [g for g in exp.games if g.name in names]
        return (tuple(g.name for g in games if replays_buffer(g) is None),
                tuple(g.name for g in games if replays_buffer(g) is not None))

    if kind == "alternating":
        games_opt = opts.get("games")
        chosen: dict = games_opt if isinstance(games_opt, dict) else {}
        out = []
        for role in [k for k in opts if k in roles]:
            names = chosen.get(role) or [g.name for g in exp.games if role in asked_roles(g.body)]
            plain, replay = split(names)
            out.append(Phase(role, (role,), plain, replay, int(opts[role])))
        return out, int(opts.get("iterations") or 1)
    if kind == "nested":
        outer = str(opts.get("outer"))
        inner_games = {opts.get("practice"), opts.get("evaluate")} | held_out_games(exp)
        names = opts["games"] if isinstance(opts.get("games"), list) else [
            g.name for g in exp.games if g.name not in inner_games and outer in asked_roles(g.body)]
        plain, replay = split(names)
        return [Phase("outer", (outer,), plain, replay, _by_role(configs, outer).steps)], 1
    held = held_out_games(exp)  # evaluated: never trained on
    names = opts["games"] if isinstance(opts.get("games"), list) else [
        g.name for g in exp.games if replays_buffer(g) is None and g.name not in held]
    plain, replay = split(names)
    return [Phase("online", tuple(roles), plain, replay, max(c.steps for c in configs))], 1


def _by_role(configs: list, role: str):
    return next(c for c in configs if c.role == role)


def slots(exp: ir.Experiment, configs: list) -> list[Slot]:
    """Every step of the schedule (of every stage), in order."""
    cycle, iterations = phases(exp, configs)
    runs: list[tuple[list[Phase], int]] = [(cycle, iterations)]
    if exp.stages:
        runs = []
        for st in exp.stages:
            if st.kind == "train":
                runs.append(([replace(ph, stage=st.name) for ph in cycle], iterations))
            elif st.kind in ("sft", "retrain"):
                runs.append(([Phase(st.name, (st.options["role"],), (), (), st.options["steps"], st.kind, st.name)], 1))
            else:
                runs.append(([Phase(st.name, (), tuple(st.options["games"]), (), 1, "evaluate", st.name)], 1))
    out: list[Slot] = []
    seen: dict[str, int] = {}
    for cycle, iterations in runs:
        for it in range(1, iterations + 1):
            for ph in cycle:
                for _ in range(ph.steps):
                    seen[ph.name] = seen.get(ph.name, 0) + 1
                    out.append(Slot(len(out) + 1, it, ph, seen[ph.name]))
    return out

