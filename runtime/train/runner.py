"""The glue between `askspec run` and the local trainer, kept out of the command module:
deciding whether a run trains, refusing what the trainer cannot do (as diagnostics at the
spec's lines), and wiring the trainer into the engine."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from askspec.ir import model as ir

if TYPE_CHECKING:
    from askspec.runtime.train.trainer import LocalTrainer


def wants_training(exp: ir.Experiment, eval_only: bool, manifest: dict | None) -> bool:
    """A run trains when the spec has train blocks and --eval-only was not given; a resumed
    run does what it did before."""
    if manifest is not None:
        return bool(manifest.get("training"))
    return bool(exp.training) and not eval_only


def report_refusal(exc, sources) -> int:
    """Print a TrainingRefused as diagnostics (file:line:col, caret) and return exit code 1."""
    from askspec.diagnostics import Diagnostic, format_diagnostic
    from askspec.span import Span

    for message, span in exc.problems:
        where = Span(span.file, span.line, span.col, span.end_line, span.end_col) if span is not None else None
        print(format_diagnostic(Diagnostic("E405", message, where), sources), file=sys.stderr)
    return 1


def prepare(exp: ir.Experiment, *, params: dict[str, Any], datasets: dict[str, list], seed: int, resolver,
            run_dir: str | None) -> LocalTrainer:
    """A LocalTrainer for `exp` (raises TrainingRefused)."""
    from askspec.runtime.train.trainer import LocalTrainer

    return LocalTrainer(exp, params=params, datasets=datasets, seed=seed, resolver=resolver, run_dir=run_dir)


def manifest_record(trainer: LocalTrainer) -> dict[str, Any]:
    return {"roles": [c.role for c in trainer.configs], "steps": trainer.steps,
            "algorithms": {c.role: c.algorithm for c in trainer.configs},
            "sessions_per_step": trainer.step_sessions(trainer.slots[0]),
            "schedule": [{"step": s.step, "iteration": s.iteration, "phase": s.phase.name, "roles": list(s.phase.roles),
                          **({"stage": s.phase.stage, "kind": s.phase.kind} if s.phase.stage else {})}
                         for s in trainer.slots[:1000]]}
