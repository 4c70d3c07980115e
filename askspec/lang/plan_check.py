"""Checker pass: the planned session count. Counts each game's sessions from the IR
arithmetically (askspec.ir.plansize) and warns (W503) when a plan is larger than
MAX_PLANNED_SESSIONS, or a single group is: `run` then wants `--sessions N`, and a group
that large cannot run at all. `describe` is the line `askspec check` prints per spec."""

from __future__ import annotations

from ..ir import model as ir
from ..ir.plansize import MAX_PLANNED_SESSIONS, dataset_sizes, first_phase, iter_game_counts, replays_buffer
from .diagnostics import DiagnosticSink
from .span import Span


def check_plan_size(exp: ir.Experiment, name_spans: dict[str, Span], sink: DiagnosticSink) -> None:
    params = exp.param_values()
    total = 0
    for game, n in iter_game_counts(first_phase(exp), params, dataset_sizes(exp)):
        span = name_spans.get(game.name)
        if game.group_size > MAX_PLANNED_SESSIONS:
            sink.warn("W503", f"game '{game.name}' plans groups of {game.group_size:,} sessions, more than the "
                      f"limit of {MAX_PLANNED_SESSIONS:,}: a group runs whole, so this game cannot run", span)
            continue
        if n is None:
            continue
        total += n
        if total > MAX_PLANNED_SESSIONS:
            sink.warn("W503", f"game '{game.name}' brings the plan to {total:,} sessions, more than the limit of "
                      f"{MAX_PLANNED_SESSIONS:,}", span, "run a part of it with `askspec run --sessions N`")
            return


def describe(exp: ir.Experiment) -> str:
    """'N sessions planned', naming the games whose sessions are counted only at run time
    (over a data file, or replaying a buffer)."""
    params = exp.param_values()
    total, later = 0, []
    for game, n in iter_game_counts(first_phase(exp), params, dataset_sizes(exp)):
        if n is None:
            it = game.iter
            over = f"data set '{it.name}'" if isinstance(it, ir.Ref) and it.scope == "data" else "its items"
            later.append(f"'{game.name}' (counts {over} when the run reads it)")
        else:
            total += n
    for game in exp.games:
        buffer = replays_buffer(game)
        if buffer is not None:
            later.append(f"'{game.name}' (replays buffer '{buffer}' once it is filled)")
    text = f"{total:,} session{'s' if total != 1 else ''} planned"
    if not later:
        return text
    games = f"game{'s' if len(later) > 1 else ''} " + ", ".join(later)
    return f"{text}, plus those of {games}" if total else f"sessions planned at run time: {games}"
