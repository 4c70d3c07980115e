"""A training schedule as a flat list of steps (`Slot`s): which phase each step lies in,
its iteration, and its global number (1, 2, ...), which checkpoints, `--resume` and
`train_steps` count in, so a resumed run re-plays exactly the steps after its checkpoint
whatever phase they lie in. The phases themselves (roles, games, sizes) are the IR's,
lowered by the compiler (askspec/lang/phases.py; docs/training.md, "Schedules").
"""

from __future__ import annotations

from dataclasses import dataclass

from askspec.ir import model as ir


@dataclass(frozen=True)
class Slot:
    step: int  # global, 1-based
    iteration: int  # 1-based (online: 1)
    phase: ir.TrainPhase
    n: int  # the how-many-th step of this phase's kind (1-based, over all iterations): the data cursor


def slots(exp: ir.Experiment) -> list[Slot]:
    """Every step of the schedule (of every stage), in order."""
    if exp.training and not exp.train_cycles:
        raise ValueError("the IR holds no lowered schedule (compile the spec with this version of askspec)")
    out: list[Slot] = []
    seen: dict[str, int] = {}
    for cycle in exp.train_cycles:
        for it in range(1, cycle.iterations + 1):
            for ph in cycle.phases:
                for _ in range(ph.steps):
                    seen[ph.name] = seen.get(ph.name, 0) + 1
                    out.append(Slot(len(out) + 1, it, ph, seen[ph.name]))
    return out
