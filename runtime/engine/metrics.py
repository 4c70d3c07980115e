"""Evaluates a spec's declared metrics over the sessions of a run (or folder of runs).

A metric is an expression over sessions: aggregate calls (`mean`, `count`, `var`, ...)
whose argument is evaluated once per session and then aggregated; everything outside
aggregates is evaluated per group. `by (a, b)` groups sessions by those session values
(game `for` names, `outcome`, `status`, `game`, or final session variables). A session of
a `sample N` group also sees its group as the route left it (Reasoning Arena's
diagnostics, reasoning_arena.txt Table 2 and Fig. 5): `route`, `routed` (a judge or a
tournament replaced the rewards), `group_judge_calls` and `nonzero_advantage` (its
group-relative advantage, Eq. 2, on the rewards after routing, is not zero; a dropped or
resampled group gives none), and `advantage`, that group-normalised reward itself,
(r − μ_G) / (σ_G + ε) with the population σ of Eq. 2 and ε = 1e-4 (0 in a dropped or
resampled group; the trainer's own estimator's values are `train_steps`'
`metrics.abs_adv_mean`). Sessions
that ended in error are excluded from every denominator and counted separately; a
metric's `n` counts the sessions that gave it a value, so a `where` that keeps none gives
n = 0 and no value ("no sessions"), never a count of sessions it did not use."""

from __future__ import annotations

import functools
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from askspec.ir import model as ir
from askspec.ir.advantages import STD_EPS, group_std
from askspec.ir.builtins import AGGREGATES
from askspec.ir.vocab import CONTEST_ROUTES, reward_counts

from askspec.runtime.engine.evaluator import Env, MissingValue, EvalError, RoleView, aggregate, evaluate
from askspec.runtime.engine.resume import json_cell


@dataclass
class SessionScope:
    """One finished session as metrics see it: its variables (game `for` names, final
    session variables, `outcome`, `status`, `game`) and its total reward per role."""

    vars: dict[str, Any]
    rewards: dict[str, float]
    group_id: str | None = None


def _load_json(v: Any) -> Any:
    v = json_cell(v)
    return v if v is not None else {}


def session_scopes(con, run_id: str | None = None) -> tuple[list[SessionScope], int]:
    """Per-session scopes for finished ok sessions, and the number of errors.

    Sessions contribute to a metric only where its variables are defined (a metric over
    `acc` counts the sessions of the game that sets `acc`)."""
    where = f"WHERE run_id = '{run_id}'" if run_id else ""
    rows = con.execute(f"SELECT run_id, session_id, game, status, outcome, params, vars, group_id, step, stage, weights "
                       f"FROM sessions {where}").fetchall()
    totals: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    named: dict[tuple[str, str], list[tuple[str, int | None, str, float]]] = defaultdict(list)
    for rid, sid, role, turn, name, value in con.execute(
            f"SELECT run_id, session_id, role, turn_index, name, value FROM rewards {where}").fetchall():
        totals[(rid, sid)][role] += float(value)
        named[(rid, sid)].append((role, turn, name, float(value)))
    groups = _group_scopes(con, where, named)
    scopes, errors = [], 0
    for rid, sid, game, status, outcome, params, vars_, group_id, step, stage, weights in rows:
        if status != "ok":
            errors += status == "error"
            continue
        scopes.append(session_scope(groups.get((rid, group_id or "", sid), {}), _load_json(vars_), _load_json(params),
                                    step=step, stage=stage, weights=weights, outcome=outcome, status=status, game=game,
                                    rewards=dict(totals[(rid, sid)]), group_id=group_id))
    return scopes, errors


def session_scope(group: dict[str, Any], vars: dict[str, Any], params: dict[str, Any], *, step: Any, stage: Any,
                  weights: Any, outcome: str | None, status: str, game: str, rewards: dict[str, float],
                  group_id: str | None) -> SessionScope:
    """One ok session's scope from what the store records of it: its group's values
    (`group_values`), its final variables and bindings (`params`), the plan's step, stage
    and weights, and its total reward per role."""
    scope = {**group, **vars, **params}
    for old in ("__step__", "__stage__", "__weights__"):  # a run of store format < 4 bound them (the view reads them)
        scope.pop(old, None)
    # the session plan's (set by the trainer; none when evaluating), unless the spec names a variable so
    scope.setdefault("step", step)
    scope.setdefault("stage", stage)
    scope.setdefault("weights", weights)
    scope.update(outcome=outcome, status=status, game=game)
    return SessionScope(scope, rewards, group_id)


ROUTED = CONTEST_ROUTES  # the reward names a routed contest records
# ε of the group-normalised reward (Reasoning Arena Eq. 2): the trainer's grpo's (askspec.ir.advantages)
ADVANTAGE_EPS = STD_EPS["grpo"]


def _group_scopes(con, where: str, named: dict) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(run, group, member session) -> the group-level values a member's metrics see."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rid, gid, route, stats, members, calls in con.execute(
            f"SELECT run_id, group_id, route, stats, members, judge_calls FROM groups {where}").fetchall():
        values = group_values(route, _load_json(stats), json_cell(members) or [], calls,
                              functools.partial(_named_of, named, rid))
        out.update(((rid, gid, sid), v) for sid, v in values.items())
    return out


def _named_of(named: dict, rid: str, sid: str) -> list[tuple[str, int | None, str, float]]:
    return named.get((rid, sid), [])


def group_values(route: str, stats: Any, members: list[str], calls: int | None,
                 named: Callable[[str], list[tuple[str, int | None, str, float]]]) -> dict[str, dict[str, Any]]:
    """Member session -> the values of its group that its metrics see (`route`, `routed`,
    `group_judge_calls`, `nonzero_advantage`, `advantage`); `named(session)` is the
    session's rewards as (role, turn index or None, name, value)."""
    role = stats.get("role") if isinstance(stats, dict) else None
    routed = str(route).split(":", 1)[0] in ROUTED
    # each member's final reward of the group's role, as the trainer counts it
    finals = [sum(v for r, turn, n, v in named(sid) if r == role and reward_counts(turn, n, routed)) for sid in members]
    mean = sum(finals) / len(finals) if finals else 0.0
    std = group_std(finals, "population")  # Eq. 2's σ, whatever the train block's `std`
    trained = route not in ("drop", "resample", "error")
    out = {}
    for sid, r in zip(members, finals):
        centred = r - mean if trained and abs(r - mean) > 1e-12 else 0.0
        out[sid] = {"route": route, "routed": routed, "group_judge_calls": int(calls or 0),
                    "nonzero_advantage": centred != 0.0, "advantage": centred / (std + ADVANTAGE_EPS)}
    return out


def _const(value: Any) -> ir.Lit:
    return ir.Lit(value=value, type="any")


def aggregate_values(arg: ir.Expr, sessions: list[SessionScope], params: dict, roles: dict) -> tuple[list, set[int]]:
    """What an aggregate (`mean(x)`, `mean(x where cond)`, ...) aggregates: its argument
    evaluated once per session (a list value counts each element), and the indices of the
    sessions that gave a value. `cond` selects the sessions that contribute; a session of a
    game that does not define the variable gives nothing."""
    cond, inner = (arg.cond, arg.seq) if isinstance(arg, ir.Filter) else (None, arg)
    values: list = []
    used: set[int] = set()
    for i, s in enumerate(sessions):
        env = Env(vars=s.vars, params=params, roles=roles, rewards=s.rewards)
        try:
            if cond is not None and not evaluate(cond, env):
                continue
            v = evaluate(inner, env)
        except MissingValue:
            continue
        if isinstance(v, list):  # an aggregate over a list inside one session, then across sessions
            values.extend(v)
            used.add(i)
        elif v is not None:
            values.append(v)
            used.add(i)
    return values, used


def _lifted(e: ir.Expr, sessions: list[SessionScope], group: dict, params: dict, roles: dict, used: set[int]) -> Any:
    """Evaluates a metric over a group of sessions: each aggregate's argument once per
    session, then aggregated; `used` collects the sessions that gave a value."""
    match e:
        case ir.CallFn(fn=fn, args=[arg]) if fn in AGGREGATES:
            values, gave = aggregate_values(arg, sessions, params, roles)
            used |= gave
            return aggregate(fn, values, e.span)
        case ir.BinaryOp():
            left = _lifted(e.left, sessions, group, params, roles, used)
            right = _lifted(e.right, sessions, group, params, roles, used)
            return evaluate(e.model_copy(update={"left": _const(left), "right": _const(right)}),
                            Env(vars=group, params=params, roles=roles))
        case ir.UnaryOp():
            v = _lifted(e.operand, sessions, group, params, roles, used)
            return evaluate(e.model_copy(update={"operand": _const(v)}), Env(vars=group, params=params))
        case ir.CallFn():
            args = [_const(_lifted(a, sessions, group, params, roles, used)) for a in e.args]
            return evaluate(e.model_copy(update={"args": args}), Env(vars=group, params=params, roles=roles))
        case _:
            return evaluate(e, Env(vars=group, params=params, roles=roles))


def _has_aggregate(e: Any) -> bool:
    if isinstance(e, ir.CallFn) and e.fn in AGGREGATES:
        return True
    if isinstance(e, (ir.Node, ir.CaseArm)):
        return any(_has_aggregate(getattr(e, f)) for f in type(e).model_fields if f != "span")
    if isinstance(e, list):
        return any(_has_aggregate(x) for x in e)
    if isinstance(e, dict):
        return any(_has_aggregate(x) for x in e.values())
    return False


def evaluate_metrics(exp: ir.Experiment, scopes: list[SessionScope]) -> list[dict]:
    """One row per metric and `by` group: its value and `n`, the number of sessions that
    gave the metric a value (0, with value None, when its `where` kept no session)."""
    params = exp.param_values()
    roles = {r.name: RoleView(r.name) for r in exp.roles}
    out = []
    for m in exp.metrics:
        groups: dict[tuple, list[SessionScope]] = defaultdict(list)
        for s in scopes:
            key = tuple(json.dumps(s.vars.get(b), sort_keys=True) for b in m.by)
            groups[key].append(s)
        lifts = _has_aggregate(m.value)
        for key in sorted(groups):
            members = groups[key]
            group_vals = {b: json.loads(k) for b, k in zip(m.by, key)}
            used: set[int] = set()
            try:
                value = _lifted(m.value, members, group_vals, params, roles, used)
            except EvalError as err:
                value = f"error: {err}"
            n = len(used) if lifts else len(members)
            if (isinstance(value, float) and math.isnan(value)) or n == 0:
                value = None
            out.append({"metric": m.name, "by": group_vals, "value": value, "n": n})
    return out


def over_sessions(exp: ir.Experiment, expr: ir.Expr, scopes: list[SessionScope]) -> Any:
    """One metric-scope expression over `scopes` (a training step's update gate)."""
    roles = {r.name: RoleView(r.name) for r in exp.roles}
    return _lifted(expr, scopes, {}, exp.param_values(), roles, set())


def gate_scope(vars: dict[str, Any], bindings: dict[str, Any], *, step: int, outcome: str | None, status: str,
               game: str, rewards: dict[str, float]) -> SessionScope:
    """One finished session as a training step's update gate (`update_when`) sees it: its
    recorded variables, its element's bindings, `step`, `outcome`, `status`, `game`, and
    its total reward per role. The local trainer and the OpenRLHF job's gate build it here."""
    scope = {**vars, **bindings}
    scope.update(step=step, outcome=outcome, status=status, game=game)
    return SessionScope(scope, dict(rewards))


def gate_closed(exp: ir.Experiment, gate: ir.Expr, scopes: list[SessionScope]) -> str | None:
    """Why the update gate `gate` skips a step whose ok sessions are `scopes`, or None when
    it holds (it must be exactly true)."""
    try:
        value = over_sessions(exp, gate, scopes)
    except (EvalError, MissingValue) as e:
        return f"update_when could not be evaluated: {e}"
    return None if value is True else f"update_when was {json.dumps(value, default=str)} over the step's sessions"


def run_metrics(path: str) -> tuple[list[dict], int]:
    """Metrics of a run directory (spec IR from the run itself) or a folder of runs."""
    from askspec.ir.canonical import from_json

    from askspec.runtime.store.views import open_store

    p = Path(path)
    run_dirs = [p] if (p / "ir.json").exists() else sorted(d for d in p.iterdir() if (d / "ir.json").exists())
    if not run_dirs:
        raise FileNotFoundError(f"no run directory (with ir.json) at {path}")
    rows: list[dict] = []
    errors = 0
    for rd in run_dirs:
        exp = from_json((rd / "ir.json").read_text(encoding="utf-8"))
        con = open_store(str(rd))
        run_id = json.loads((rd / "manifest.json").read_text())["run_id"]
        scopes, errs = session_scopes(con, run_id)
        errors += errs
        if exp.stages and any(s.vars.get("stage") is not None for s in scopes):  # an --eval-only run has none
            rows.extend({"run_id": run_id, **row} for row in stage_metrics(exp, scopes, con, run_id))
            continue
        for row in evaluate_metrics(exp, scopes):
            rows.append({"run_id": run_id, **row})
    return rows, errors


def stage_metrics(exp: ir.Experiment, scopes: list[SessionScope], con, run_id: str) -> list[dict]:
    """Per stage, in order: the training it did (mean loss and reward of its updates, per
    role, from train_steps), the declared metrics over its sessions (an evaluate stage's per
    weights), and an evaluate stage's pass@k / avg@n (docs/training.md, "Stages")."""
    from askspec.runtime.engine.passk import evaluation_rows

    # a step skipped for zero advantage or by the spec's update gate played and was rewarded
    # like any other (only its update did not run: it has no loss); the other skips have no
    # batch to speak of
    trained = con.execute(
        "SELECT metrics->>'stage', role, count(*), avg(loss), count(loss), avg(reward_mean), "
        "avg(CAST(metrics->>'abs_adv_mean' AS DOUBLE)), avg(1 - zero_adv_share) FROM train_steps "
        "WHERE run_id = ? AND (metrics->>'skipped' IS NULL OR metrics->>'skipped' IN ('zero_advantage', 'gate')) "
        "GROUP BY ALL ORDER BY ALL", [run_id]).fetchall()
    out: list[dict] = []
    for st in exp.stages:
        for stage, role, steps, loss, losses, reward, abs_adv, nonzero in trained:
            if stage == st.name:
                out.append({"stage": st.name, "metric": "loss", "by": {"role": role}, "value": loss, "n": losses})
                if st.kind != "sft":
                    out.append({"stage": st.name, "metric": "reward_mean", "by": {"role": role}, "value": reward, "n": steps})
                    # the trainer's advantages (its estimator): Reasoning Arena's Fig. 5 diagnostics
                    out.append({"stage": st.name, "metric": "abs_advantage_mean", "by": {"role": role}, "value": abs_adv,
                                "n": steps})
                    out.append({"stage": st.name, "metric": "nonzero_advantage_share", "by": {"role": role},
                                "value": nonzero, "n": steps})
        mine = [s for s in scopes if s.vars.get("stage") == st.name]
        if st.kind == "evaluate":
            score = st.options["score"]
            out.extend({"stage": st.name, **row} for row in evaluation_rows(
                st, [(s.vars["game"], s.vars.get("weights"), s.group_id, s.vars.get(score)) for s in mine]))
            for weights in st.options["weights"]:
                for row in evaluate_metrics(exp, [s for s in mine if s.vars.get("weights") == weights]):
                    out.append({"stage": st.name, **row, "by": {**row["by"], "weights": weights}})
        elif mine:
            out.extend({"stage": st.name, **row} for row in evaluate_metrics(exp, mine))
    return out
