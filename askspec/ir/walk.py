"""The step lists nested in an IR step, defined once: every pass over a game body (call
bounds, the roles a game asks, a target's checks, the render) walks it with `bodies`."""

from __future__ import annotations

from typing import Iterator

from . import model as ir


def bodies(s: ir.Step) -> list[tuple[int, list[ir.Step]]]:
    """(how many times it can run per run of `s`, step list) for each list nested in `s`:
    a loop's body with its bound; each branch of an `if` and its `else` once (they are
    alternatives: one of them runs)."""
    match s:
        case ir.RepeatStep():
            return [(s.bound, s.body)]
        case ir.WhileStep() | ir.ForStep():
            return [(s.limit, s.body)]
        case ir.IfStep():
            return [(1, b.body) for b in s.branches] + [(1, s.orelse)]
    return []


def all_steps(steps: list[ir.Step]) -> Iterator[ir.Step]:
    """Every step of `steps` at any depth, each before the steps nested in it."""
    for s in steps:
        yield s
        for _, body in bodies(s):
            yield from all_steps(body)
