"""How many sessions a plan holds, counted from the IR arithmetically (never by listing
them): the checker reports it, the runtime shows it as the progress total and uses it to
cut a plan without building it.

A game plans (items of its `for`) × `times` × `sample` sessions. The items are counted
from the shape of the `for` expression: a list literal, a list parameter, an inline data
set, `range`, `pairs` and `product` of those. Anything else (a data file before it is
read, a `where` filter, a buffer filled during the run) has no static count: `None`.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Iterator, Mapping, TypeGuard

from askspec.ir import model as ir
from askspec.ir.builtins import spec_range

# Above this many planned sessions `check` warns (W503) and `run` wants `--sessions`; a
# single group (`sample N`) larger than this cannot run at all. Documented in
# docs/language.md ("Diagnostics") and the README.
MAX_PLANNED_SESSIONS = 1_000_000
# A training run's steps are listed when it starts (its schedule), and each step's
# sessions are played and held whole: past these it is refused (E405), past
# MAX_PLANNED_SESSIONS sessions in all it is warned about (W503). docs/training.md.
MAX_TRAINING_STEPS = 1_000_000
MAX_STEP_SESSIONS = MAX_PLANNED_SESSIONS


# The constant arithmetic of the spec language (the checker's constant folding uses it too).
ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


class Unknown(Exception):
    """The expression has no value or length known before the run."""


def const_value(e: ir.Expr, params: Mapping[str, Any]) -> Any:
    """The value of a constant expression (literals, parameters, + - * /, len)."""
    if isinstance(e, ir.Lit):
        return e.value
    if isinstance(e, ir.Ref) and e.scope == "param" and e.name in params:
        return params[e.name]
    if isinstance(e, ir.ListOf):
        return [const_value(x, params) for x in e.items]
    if isinstance(e, ir.UnaryOp) and e.op == "-":
        v = const_value(e.operand, params)
        if _is_number(v):
            return -v
    if isinstance(e, ir.BinaryOp) and e.op in ARITHMETIC:
        a, b = const_value(e.left, params), const_value(e.right, params)
        if _is_number(a) and _is_number(b) and not (e.op == "/" and b == 0):
            return ARITHMETIC[e.op](a, b)
    if isinstance(e, ir.CallFn) and e.fn == "len" and len(e.args) == 1:
        return len(const_list(e.args[0], params))
    raise Unknown


def const_list(e: ir.Expr, params: Mapping[str, Any]) -> list:
    v = const_value(e, params)
    if not isinstance(v, list):
        raise Unknown
    return v


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def items_count(e: ir.Expr, params: Mapping[str, Any], sizes: Mapping[str, int] | None = None) -> int:
    """How many items a game's `for` expression yields; `sizes` holds the lengths of data
    sets already loaded (the runtime's). Raises Unknown when it cannot be counted."""
    sizes = sizes or {}
    if isinstance(e, ir.Ref) and e.scope == "data":
        if e.name in sizes:
            return sizes[e.name]
        raise Unknown
    if isinstance(e, ir.CallFn) and not e.kwargs:
        if e.fn == "range" and 1 <= len(e.args) <= 2:
            bounds = [const_value(a, params) for a in e.args]
            if not all(_is_number(b) for b in bounds):
                raise Unknown
            r = spec_range(*bounds)
            return len(r)
        if e.fn == "pairs" and len(e.args) == 1:
            n = items_count(e.args[0], params, sizes)
            return n * (n - 1) // 2
        if e.fn == "product" and e.args:
            return math.prod(items_count(a, params, sizes) for a in e.args)
    if isinstance(e, ir.ListOf):
        return len(e.items)
    return len(const_list(e, params))


def dataset_sizes(exp: ir.Experiment) -> dict[str, int]:
    """Sizes of the data sets known from the IR alone: inline items (after `limit`), when
    no `where` filter leaves out an unknown number of them (the run counts those)."""
    out = {}
    for d in exp.datasets:
        if d.items is not None and d.filter is None:
            n = len(d.items)
            limit = d.options.get("limit")
            if _is_number(limit) and limit >= 0:
                n = min(n, int(limit))
            out[d.name] = n
    return out


def replays_buffer(game: ir.Game) -> str | None:
    """The buffer a game iterates over, if any: such a game runs as a later phase, once
    the games before it have filled the buffer, and is planned then."""
    it = game.iter
    if isinstance(it, ir.Ref) and it.scope == "buffer":
        return it.name
    return None


def game_sessions(game: ir.Game, params: Mapping[str, Any], sizes: Mapping[str, int] | None = None) -> int:
    """Sessions one game plans (raises Unknown when its items cannot be counted)."""
    items = 1 if game.iter is None else items_count(game.iter, params, sizes)
    return items * game.times * game.group_size


def held_out_games(exp: ir.Experiment) -> set[str]:
    """The games evaluate stages play and those retrain stages sample their items with:
    held out of training (and of the first phase)."""
    return ({name for s in exp.stages if s.kind == "evaluate" for name in s.options.get("games", [])}
            | {s.options["sample"] for s in exp.stages if s.kind == "retrain" and s.options.get("sample")})


def first_phase(exp: ir.Experiment) -> list[ir.Game]:
    """The games planned at the start of a run (not those replaying a buffer), what an
    `--eval-only` run plays: not the games of evaluate stages either (they compare trained
    with initial weights, which needs the stages), unless nothing else is left."""
    games = [g for g in exp.games if replays_buffer(g) is None]
    held = held_out_games(exp)
    return [g for g in games if g.name not in held] or games


def cut_total(counts: list[tuple[int, int]], max_sessions: int | None) -> int:
    """Sessions left after cutting games planned in order at `max_sessions`, keeping whole
    groups; `counts` holds (sessions, group size) per game."""
    total = 0
    for n, group in counts:
        if max_sessions is not None and total + n > max_sessions:
            room = max(0, max_sessions - total)
            return total + min(n, -(-room // group) * group)  # up to the end of the group
        total += n
    return total


def training_steps(t: ir.Training, exp: ir.Experiment) -> int:
    """The optimizer steps of a train block (its learning-rate schedule's length), as
    lowered (the schedule's alone for an IR written before settings were lowered)."""
    return t.config.steps if t.config is not None else schedule_steps(t.role, None, exp)


def schedule_steps(role: str, steps: int | None, exp: ir.Experiment) -> int:
    """The optimizer steps of `role`'s train block whose `steps` setting is `steps`: it,
    else the online schedule's; an alternating schedule's `ROLE = N` × iterations; a
    nested schedule's outer steps, or each inner copy's own steps."""
    sched = exp.schedule
    if steps is None and sched is not None and sched.kind == "online":
        steps = sched.options.get("steps")
    if sched is not None and sched.kind == "alternating":
        steps = int(sched.options.get(role) or 0) * int(sched.options.get("iterations") or 1) or steps
    if sched is not None and sched.kind == "nested":
        opts = sched.options
        if role == opts.get("outer"):
            steps = opts.get("outer_steps") or steps
        elif role == opts.get("inner"):
            steps = int(opts.get("inner_steps") or 1) + int(opts.get("extra_inner_steps") or 0)
    return int(steps or 1)


def group_size(game: ir.Game, group: int | None) -> int:
    """The sessions of one group of `game` when a train block with `group` trains on it:
    a `sample N` game's N, else the block's `group` (1 without one)."""
    return game.group_size if game.group_size > 1 else int(group or 1)


def whole_groups(batch: int | None, size: int) -> int:
    """`batch` sessions rounded up to whole groups of `size` (one group without a batch)."""
    return -(-int(batch or size) // size) * size


def training_step_sessions(t: ir.Training, games: list[ir.Game]) -> int:
    """The most sessions one step of a train block plays: `batch` rounded up to whole
    groups (a `sample N` game's N, else the block's `group`), at least one group."""
    group, batch = (t.config.group, t.config.batch) if t.config is not None else (None, None)
    size = max([group_size(g, group) for g in games] or [int(group or 1)])
    return whole_groups(batch, size)


def iter_game_counts(games: list[ir.Game], params: Mapping[str, Any],
                     sizes: Mapping[str, int] | None = None) -> Iterator[tuple[ir.Game, int | None]]:
    for g in games:
        try:
            yield g, game_sessions(g, params, sizes)
        except Unknown:
            yield g, None


def weight_rounds(exp: ir.Experiment, stage: ir.Stage) -> int:
    """How many times at most an evaluate stage plays each element's samples: once per
    weights, and its `trained` weights once per checkpoint of the averaging window of a
    post-hoc plateau (`keep = plateau(..., select = posthoc)`) before it: at most
    average / every + 1 kept steps in the window, or the first kept after it, and the
    stage's last step (runtime/train/stages.py, averaged_checkpoints)."""
    rounds = 1
    for st in exp.stages:
        if st.name == stage.name:
            break
        keep = st.options.get("keep") or {}
        if st.kind == "retrain" and keep.get("select") == "posthoc":
            rounds = max(rounds, int(keep["average"]) // int(keep["every"]) + 2)
    return sum(rounds if w == "trained" else 1 for w in stage.options["weights"])
