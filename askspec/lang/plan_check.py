"""Checker pass: the planned session count. Counts each game's sessions from the IR
arithmetically (askspec.ir.plansize) and warns (W503) when a plan is larger than
MAX_PLANNED_SESSIONS, or a single group is: `run` then wants `--sessions N`, and a group
that large cannot run at all. Training plans are bounded the same way (check_training_size):
steps × sessions per step past the limit warn (W503), a step or a schedule too large to
hold is refused (E405). `describe` is the line `askspec check` prints per spec."""

from __future__ import annotations

from ..ir import model as ir
from ..ir.plansize import (MAX_PLANNED_SESSIONS, MAX_STEP_SESSIONS, MAX_TRAINING_STEPS, dataset_sizes, first_phase,
                           iter_game_counts, replays_buffer, training_step_sessions, training_steps)
from ..diagnostics import DiagnosticSink
from ..span import Span


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


def check_training_size(exp: ir.Experiment, spans: dict[str, dict[str, Span]], sink: DiagnosticSink) -> None:
    """Each train block's plan: steps × sessions per step. `spans` maps a trained role to
    its block's setting spans (`group`, `batch`, `steps`; "" for the block)."""
    games = first_phase(exp)
    totals = []
    for t in exp.training:
        at = spans.get(t.role, {})
        block = at.get("")
        steps, per_step = training_steps(t, exp), training_step_sessions(t, games)
        if per_step > MAX_STEP_SESSIONS:
            where = at.get("batch") if "batch" in t.given else at.get("group")
            sink.error("E405", f"train {t.role}: a step plays {per_step:,} sessions, more than the limit of "
                       f"{MAX_STEP_SESSIONS:,} (a step's sessions are played and held whole)", where or block,
                       "lower `batch` or `group`")
            continue
        if steps > MAX_TRAINING_STEPS:
            sink.error("E405", f"train {t.role}: {steps:,} steps, more than the limit of {MAX_TRAINING_STEPS:,} "
                       f"(the schedule lists every step when the run starts)", at.get("steps") or block,
                       "lower `steps` (or the schedule's)")
            continue
        totals.append((t, steps * per_step, at.get("steps") or block))
    if not totals:
        return
    online = exp.schedule is None or exp.schedule.kind == "online"
    # online: one step plays the largest block's batch for every role; otherwise phases follow each other
    total = max(n for _, n, _ in totals) if online else sum(n for _, n, _ in totals)
    if total > MAX_PLANNED_SESSIONS:
        t, n, span = max(totals, key=lambda x: x[1])
        sink.warn("W503", f"the training plan holds {total:,} sessions ({training_steps(t, exp):,} steps × "
                  f"{training_step_sessions(t, games):,} of train {t.role}), more than the limit of "
                  f"{MAX_PLANNED_SESSIONS:,}", span, "lower `steps`, `batch` or `group`")


def describe(exp: ir.Experiment) -> str:
    """'N sessions planned', naming the games whose sessions are counted only at run time
    (over a data file, or replaying a buffer); for a spec that trains, what each train
    block plays (the count before it is one pass over the games: an --eval-only run)."""
    text = _describe_pass(exp)
    if not exp.training:
        return text
    games = first_phase(exp)
    blocks = []
    for t in exp.training:
        steps, per_step = training_steps(t, exp), training_step_sessions(t, games)
        blocks.append(f"train {t.role}: {steps:,} step{'s' if steps != 1 else ''} × {per_step:,} "
                      f"session{'s' if per_step != 1 else ''}")
    return f"{text} (one pass, as --eval-only plays it); {'; '.join(blocks)}"


def _describe_pass(exp: ir.Experiment) -> str:
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
