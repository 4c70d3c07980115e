"""Evaluates a spec's declared metrics over the sessions of a run (or folder of runs).

A metric is an expression over sessions: aggregate calls (`mean`, `count`, `var`, ...)
whose argument is evaluated once per session and then aggregated; everything outside
aggregates is evaluated per group. `by (a, b)` groups sessions by those session values
(game `for` names, `outcome`, `status`, `game`, or final session variables). Sessions
that ended in error are excluded from every denominator and counted separately."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from askspec.ir import model as ir

from askspec.runtime.engine.evaluator import AGGREGATES, Env, EvalError, MissingValue, RoleView, evaluate


def _load_json(v: Any) -> Any:
    from askspec.runtime.engine.resume import json_cell

    v = json_cell(v)
    return v if v is not None else {}


def session_scopes(con, run_id: str | None = None) -> tuple[list[dict], int]:
    """Per-session variable scopes for finished ok sessions, and the number of errors.

    Sessions contribute to a metric only where its variables are defined (a metric over
    `acc` counts the sessions of the game that sets `acc`)."""
    where = f"WHERE run_id = '{run_id}'" if run_id else ""
    rows = con.execute(f"SELECT run_id, session_id, game, status, outcome, params, vars FROM sessions {where}").fetchall()
    totals: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for rid, sid, role, value in con.execute(f"SELECT run_id, session_id, role, value FROM rewards {where}").fetchall():
        totals[(rid, sid)][role] += float(value)
    scopes, errors = [], 0
    for rid, sid, game, status, outcome, params, vars_ in rows:
        if status != "ok":
            errors += status == "error"
            continue
        scope = {**_load_json(vars_), **_load_json(params)}
        scope.update(outcome=outcome, status=status, game=game, __rewards__=dict(totals[(rid, sid)]))
        scopes.append(scope)
    return scopes, errors


def _lifted(e: ir.Expr, sessions: list[dict], group: dict, params: dict, roles: dict) -> Any:
    if e.kind == "call" and e.fn in AGGREGATES and len(e.args) == 1:
        arg = e.args[0]
        # `mean(x where cond)`: cond selects the sessions that contribute
        cond = arg.cond if arg.kind == "where" else None
        inner = arg.seq if arg.kind == "where" else arg
        values = []
        for s in sessions:
            env = Env(vars=s, params=params, roles=roles)
            try:
                if cond is not None and not evaluate(cond, env):
                    continue
                v = evaluate(inner, env)
            except MissingValue:
                continue  # a session of a game that does not define this variable
            except EvalError:
                raise
            if isinstance(v, list):  # an aggregate over a list inside one session, then across sessions
                values.extend(v)
            elif v is not None:
                values.append(v)
        from askspec.runtime.engine.evaluator import _agg

        return _agg(e.fn, values, e.span)
    if e.kind == "binary":
        l = _lifted(e.left, sessions, group, params, roles)
        r = _lifted(e.right, sessions, group, params, roles)
        return evaluate(e.model_copy(update={"left": ir.Lit(value=l, type="any"), "right": ir.Lit(value=r, type="any")}),
                        Env(vars=group, params=params, roles=roles))
    if e.kind == "unary":
        v = _lifted(e.operand, sessions, group, params, roles)
        return evaluate(e.model_copy(update={"operand": ir.Lit(value=v, type="any")}), Env(vars=group, params=params))
    if e.kind == "call":
        args = [ir.Lit(value=_lifted(a, sessions, group, params, roles), type="any") for a in e.args]
        return evaluate(e.model_copy(update={"args": args}), Env(vars=group, params=params, roles=roles))
    return evaluate(e, Env(vars=group, params=params, roles=roles))


def evaluate_metrics(exp: ir.Experiment, scopes: list[dict]) -> list[dict]:
    params = exp.param_values()
    roles = {r.name: RoleView(r.name) for r in exp.roles}
    out = []
    for m in exp.metrics:
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for s in scopes:
            key = tuple(json.dumps(s.get(b), sort_keys=True) for b in m.by)
            groups[key].append(s)
        for key in sorted(groups):
            members = groups[key]
            group_vals = {b: json.loads(k) for b, k in zip(m.by, key)}
            try:
                value = _lifted(m.value, members, group_vals, params, roles)
            except EvalError as err:
                value = f"error: {err}"
            if isinstance(value, float) and math.isnan(value):
                value = None
            out.append({"metric": m.name, "by": group_vals, "value": value, "n": len(members)})
    return out


def run_metrics(path: str) -> tuple[list[dict], int]:
    """Metrics of a run directory (spec IR from the run itself) or a folder of runs."""
    from askspec.ir.canonical import from_json

    from askspec.runtime.store.views import open_store

    p = Path(path)
    run_dirs = [p] if (p / "ir.json").exists() else sorted(d for d in p.iterdir() if (d / "ir.json").exists())
    if not run_dirs:
        raise FileNotFoundError(f"no run directory (with ir.json) at {path}")
    rows, errors = [], 0
    for rd in run_dirs:
        exp = from_json((rd / "ir.json").read_text(encoding="utf-8"))
        con = open_store(str(rd))
        run_id = json.loads((rd / "manifest.json").read_text())["run_id"]
        scopes, errs = session_scopes(con, run_id)
        errors += errs
        for row in evaluate_metrics(exp, scopes):
            rows.append({"run_id": run_id, **row})
    return rows, errors
