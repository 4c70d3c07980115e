"""The training schedule lowered into the IR (`Experiment.train_cycles`, `inner_phase`):
which roles each phase updates, which games it plays and how many sessions of each.
The compiler calls `lower_phases` once the train blocks are lowered; the runtime lists
its steps from the result (runtime/train/schedule.py) and plans each with the sizes here,
and the OpenRLHF target reads the same sizes, so no one computes them again.

- `online` (the default): one phase; every step plays the games and updates every
  trained role (a role whose `steps` is fewer stops updating after its own steps).
- `alternating`: phases in the schedule's declaration order, `ROLE = N` steps each, the
  whole cycle `iterations` times.
- `nested` (SOAR): one phase of the outer role's steps; the inner loop's practice game is
  `inner_phase`.
- With stages: a cycle per stage in declaration order: the `train` stage's is the cycle
  above, an `sft` or `retrain` stage is one phase of its own steps, an `evaluate` stage
  one step playing its games.

docs/training.md ("Schedules", "Stages") describes what each step does.
"""

from __future__ import annotations

from typing import Literal

from ..ir import model as ir
from ..ir.plansize import group_size, held_out_games, replays_buffer, whole_groups
from ..ir.walk import all_steps


def asked_roles(steps: list) -> set[str]:
    """Roles a game body asks (any depth)."""
    return {r for s in all_steps(steps) if isinstance(s, ir.AskStep) for r in s.roles}


def lower_phases(exp: ir.Experiment) -> ir.Experiment:
    """Fill in `exp.train_cycles` and `exp.inner_phase` from the lowered train blocks,
    the schedule and the stages (nothing without train blocks)."""
    exp.train_cycles, exp.inner_phase = [], None
    if not exp.training or any(t.config is None for t in exp.training):
        return exp
    cycle, iterations = _cycle(exp)
    if not exp.stages:
        exp.train_cycles = [ir.PhaseCycle(phases=cycle, iterations=iterations)]
    for st in exp.stages:
        if st.kind == "train":
            exp.train_cycles.append(ir.PhaseCycle(phases=[ph.model_copy(update={"stage": st.name}) for ph in cycle],
                                                  iterations=iterations))
        elif st.kind == "sft":
            exp.train_cycles.append(ir.PhaseCycle(phases=[ir.TrainPhase(
                name=st.name, kind="sft", stage=st.name, roles=(st.options["role"],), steps=int(st.options["steps"]))]))
        elif st.kind == "retrain":
            exp.train_cycles.append(ir.PhaseCycle(phases=[_retrain_phase(exp, st)]))
        else:
            games = tuple(st.options["games"])
            exp.train_cycles.append(ir.PhaseCycle(phases=[ir.TrainPhase(
                name=st.name, kind="evaluate", stage=st.name, plain=games,
                groups={name: _game(exp, name).group_size for name in games})]))
    sched = exp.schedule
    if sched is not None and sched.kind == "nested" and sched.options.get("practice"):
        exp.inner_phase = _one_game_phase(exp, "inner", "inner", str(sched.options["inner"]),
                                          str(sched.options["practice"]), _steps(exp, str(sched.options["inner"])))
    return exp


def _cycle(exp: ir.Experiment) -> tuple[list[ir.TrainPhase], int]:
    """The phases of one cycle of the `train` schedule and the number of cycles."""
    sched = exp.schedule
    roles = [t.role for t in exp.training]
    kind = sched.kind if sched is not None else "online"
    opts = sched.options if sched is not None else {}
    if kind == "alternating":
        games_opt = opts.get("games")
        chosen: dict = games_opt if isinstance(games_opt, dict) else {}
        out = []
        for role in [k for k in opts if k in roles]:
            names = chosen.get(role) or [g.name for g in exp.games if role in asked_roles(g.body)]
            out.append(_play_phase(exp, role, (role,), names, int(opts[role])))
        return out, int(opts.get("iterations") or 1)
    if kind == "nested":
        outer = str(opts.get("outer"))
        inner_games = {opts.get("practice"), opts.get("evaluate")} | held_out_games(exp)
        names = opts["games"] if isinstance(opts.get("games"), list) else [
            g.name for g in exp.games if g.name not in inner_games and outer in asked_roles(g.body)]
        return [_play_phase(exp, "outer", (outer,), names, _steps(exp, outer))], 1
    held = held_out_games(exp)  # evaluated: never trained on
    names = opts["games"] if isinstance(opts.get("games"), list) else [
        g.name for g in exp.games if replays_buffer(g) is None and g.name not in held]
    return [_play_phase(exp, "online", tuple(roles), names, max(_steps(exp, r) for r in roles))], 1


def _play_phase(exp: ir.Experiment, name: str, roles: tuple[str, ...], names: list[str], steps: int) -> ir.TrainPhase:
    """A phase playing `names` (in the spec's order) and updating `roles`: its sizes are the
    largest `group` and `batch` of the roles' train blocks."""
    settings = [_settings(exp, r) for r in roles]
    groups_set = [c.group for c in settings if c.group is not None]
    batches = [c.batch for c in settings if c.batch is not None]
    group = max(groups_set) if groups_set else None
    batch = max(batches) if batches else None
    games = [g for g in exp.games if g.name in names]
    plain = tuple(g.name for g in games if replays_buffer(g) is None)
    replay = tuple(g.name for g in games if replays_buffer(g) is not None)
    groups = {g.name: group_size(g, group) for g in games}
    return ir.TrainPhase(
        name=name, roles=roles, plain=plain, replay=replay, steps=steps, groups=groups,
        batch=batch if batch is not None else (groups[plain[0]] if plain else 1),
        replay_items={n: whole_groups(batch, groups[n]) // groups[n] for n in replay})


def _retrain_phase(exp: ir.Experiment, st: ir.Stage) -> ir.TrainPhase:
    """A retrain stage: its role trained afresh on its game's items, in whole groups of
    the game under the role's train block (its `sample` game is played in the game's own
    groups)."""
    return _one_game_phase(exp, st.name, "retrain", st.options["role"], st.options["game"], int(st.options["steps"])
                           ).model_copy(update={"stage": st.name})


def _one_game_phase(exp: ir.Experiment, name: str, kind: Literal["retrain", "inner"], role: str, game_name: str,
                    steps: int) -> ir.TrainPhase:
    """A phase playing one game over items it is given (not cycling the spec's data): the
    game is `groups`' one key, `plain` is empty."""
    cfg = _settings(exp, role)
    size = group_size(_game(exp, game_name), cfg.group)
    return ir.TrainPhase(name=name, kind=kind, roles=(role,), steps=steps, groups={game_name: size},
                         batch=whole_groups(cfg.batch, size))


def _settings(exp: ir.Experiment, role: str) -> ir.TrainSettings:
    config = next(t.config for t in exp.training if t.role == role)
    assert config is not None  # lower_phases runs on lowered train blocks only
    return config


def _steps(exp: ir.Experiment, role: str) -> int:
    return _settings(exp, role).steps


def _game(exp: ir.Experiment, name: str) -> ir.Game:
    return next(g for g in exp.games if g.name == name)
