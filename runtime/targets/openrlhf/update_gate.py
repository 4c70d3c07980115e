"""A train block's update gate (`update_when = COND`) in an OpenRLHF job.

The gate is a yes/no over a training step's sessions (PasoDoble: no update without a
valid question), evaluated as the local trainer evaluates it (runtime/engine/metrics.py:
`gate_scope`, `gate_closed`; docs/training.md, "Skipped steps"). In a job the sessions
are played by the agents in the vLLM engines' processes and the step is taken in the PPO
trainer's, so the agent writes each rollout's session, as the gate sees it, into the
label it returns (field `askspec_session`: a process-unique id, the game, status,
outcome, total reward per role, and the variables and bindings the gate names).
OpenRLHF carries a rollout's label untouched into the trainer's rollout samples, where
askspec_ext/gate.py reads them back (`JobGate`): the N rollouts of a session of siblings
count once, an errored session not at all.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from pydantic import BaseModel

from askspec.ir import model as ir

from askspec.runtime.engine.metrics import gate_closed, gate_scope
from askspec.runtime.targets.openrlhf.jobfile import PhaseJob, as_phase_job

FIELD = "askspec_session"


def names(expr: Any) -> set[str]:
    """Every name an IR expression refers to."""
    if isinstance(expr, ir.Ref):
        return {expr.name}
    if isinstance(expr, BaseModel):
        return set().union(*(names(getattr(expr, k)) for k in type(expr).model_fields if k != "span"))
    if isinstance(expr, (list, tuple)):
        return set().union(*(names(x) for x in expr))
    if isinstance(expr, dict):
        return set().union(*(names(x) for x in expr.values()))
    return set()


def session_fields(uid: str, game: str, status: str, outcome: str | None, vars: dict[str, Any],
                   bindings: dict[str, Any], rewards: dict[str, float], wanted: set[str]) -> dict[str, Any]:
    """A session as the label carries it: only the variables and bindings the gate names
    (a passage or a transcript would travel with every rollout otherwise)."""
    return {"id": uid, "game": game, "status": status, "outcome": outcome,
            "vars": {k: v for k, v in vars.items() if k in wanted},
            "bindings": {k: v for k, v in bindings.items() if k in wanted}, "rewards": dict(rewards)}


def labelled(label: str, session: dict[str, Any]) -> str:
    """The rollout's label with its session added."""
    return json.dumps({**json.loads(label), FIELD: session}, ensure_ascii=False, default=str)


class GateError(RuntimeError):
    """A rollout reached the trainer without its session (an agent that is not this job's)."""


class JobGate:
    """The update gate of a job's trained role (job.json), over rollout labels."""

    def __init__(self, job: PhaseJob | Mapping[str, Any]) -> None:
        job = as_phase_job(job)
        self.exp = job.ir()
        self.role: str = job.trained_role
        gate = next((t.update_when for t in self.exp.training if t.role == self.role), None)
        if gate is None:
            raise ValueError(f"the job's role '{self.role}' has no update_when")
        self.gate: ir.Expr = gate

    def sessions(self, labels: Iterable[str]) -> list[dict[str, Any]]:
        """The distinct sessions of a step's rollouts, in order."""
        seen: dict[str, dict[str, Any]] = {}
        for label in labels:
            session = json.loads(label).get(FIELD)
            if session is None:
                raise GateError(f"a rollout's label has no `{FIELD}` (the agent writes it when the job's train block "
                                "has update_when): was agent.py generated with this job?")
            seen.setdefault(session["id"], session)
        return list(seen.values())

    def closed(self, sessions: list[dict[str, Any]], step: int) -> str | None:
        """Why the gate skips step `step` (its sessions' update), or None when it holds."""
        scopes = [gate_scope(s["vars"], s["bindings"], step=step, outcome=s["outcome"], status=s["status"],
                             game=s["game"], rewards=s["rewards"]) for s in sessions if s["status"] == "ok"]
        return gate_closed(self.exp, self.gate, scopes)
