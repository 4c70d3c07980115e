"""`askspec export RUN --inspect DIR`: a run as Inspect eval logs (inspect-ai 0.3.285's
`.eval` format), one log per game, written with inspect-ai's own types and writer.

What goes where (docs/store.md, "Inspect logs"):

- a log per game; its `EvalSpec.model_roles` maps each role to the model(s) it ran on,
  `EvalSpec.model` is the trained role's model (else the first role's), and the spec's hash,
  the run's seed, parameters and overrides are `EvalSpec.metadata["askspec"]`;
- a sample per session: `messages` is the transcript (each ask and its reply, the reply an
  assistant message naming its model, both carrying the askspec role in `metadata`),
  `events` one span per role holding that role's model calls (`ModelEvent.role`), `scores`
  one per role (the reward the trainer uses: a routed group's contest reward in place of
  the verifier's; each reward by name in the score's metadata) and the outcome, `metadata` the session's variables, parameters, seed and its group (route,
  statistics, members, the matches it played), `model_usage`/`role_usage` its tokens;
- a group route's judge calls (a tournament's, a pointwise judge's) belong to no session:
  they are in the sample of the group's first member, in a span of their own, so the
  log's token totals are the run's.

inspect-ai is an optional extra (`pip install 'askspec[inspect]'`): without it the export
says so and writes nothing.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from askspec.ir.vocab import CONTEST_ROUTES as ROUTED, reward_counts

from askspec.runtime.store.describe import json_value
from askspec.runtime.store.views import Store

INSPECT_VERSION = "0.3.285"
MISSING = ("inspect-ai is not installed: `askspec export --inspect` writes Inspect logs with its library; "
           f"install it with: pip install 'askspec[inspect]' (inspect-ai=={INSPECT_VERSION})")
# askspec's finish reasons as Inspect's stop reasons
STOP_REASONS: dict[str, Any] = {"stop": "stop", "length": "max_tokens"}


class InspectMissing(Exception):
    """inspect-ai cannot be imported."""


def _rows(store: Store, sql: str, *params: Any) -> list[dict[str, Any]]:
    cur = store.con.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _iso(ts: Any) -> str:
    """A store timestamp (naive UTC) as Inspect's UTC datetime string."""
    return ts.isoformat() + "+00:00" if ts is not None else ""


def export_inspect(store: Store, out: Path) -> list[tuple[Path, int]]:
    """Write one `.eval` log per game of the store's one run into `out`; (file, samples)."""
    try:
        from inspect_ai.log import write_eval_log
    except ImportError:
        raise InspectMissing(MISSING) from None
    (run,) = _rows(store, "SELECT * FROM runs")
    sessions = _rows(store, "SELECT * FROM sessions ORDER BY index, session_id")
    turns = _rows(store, "SELECT * FROM turns ORDER BY session_id, turn_index")
    rewards = _rows(store, "SELECT * FROM rewards ORDER BY session_id, ts")
    groups = {g["group_id"]: g for g in _rows(store, "SELECT * FROM groups")}
    matches = _rows(store, "SELECT * FROM matches ORDER BY ts")
    by_session: dict[str, list[dict]] = defaultdict(list)
    for t in turns:
        by_session[t["session_id"]].append(t)
    rewards_of: dict[str, list[dict]] = defaultdict(list)
    for r in rewards:
        rewards_of[r["session_id"]].append(r)
    games: dict[str, list[dict]] = defaultdict(list)
    for s in sessions:
        games[s["game"]].append(s)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for game, members in games.items():
        log = _game_log(run, game, members, by_session, rewards_of, groups, matches)
        stamp = (run["started_at"].strftime("%Y-%m-%dT%H-%M-%S") if run["started_at"] else "run")
        # Inspect's own naming, {created}_{task}_{id}.eval: its log listing splits the name at "_"
        task = f"{run['experiment']}-{game}".replace("_", "-")
        path = out / f"{stamp}+00-00_{task}_{run['run_id'][-6:]}.eval"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            write_eval_log(log, str(tmp), format="eval")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        written.append((path, len(members)))
    return written


def _game_log(run: dict, game: str, sessions: list[dict], by_session: dict[str, list[dict]],
              rewards_of: dict[str, list[dict]], groups: dict[str, dict], matches: list[dict]) -> Any:
    from inspect_ai.log import (EvalConfig, EvalDataset, EvalLog, EvalMetric, EvalResults, EvalScore, EvalSpec,
                                EvalStats)
    from inspect_ai.model import ModelConfig, ModelUsage

    roles = json_value(run["roles"]) or {}
    # a group's judge calls go with its first member's sample (module docstring)
    judge_turns: dict[str, list[dict]] = {}
    for gid, g in groups.items():
        first = (g["members"] or [None])[0]
        if first is not None and gid in by_session:
            judge_turns[first] = by_session[gid]
    samples = [_sample(s, by_session.get(s["session_id"], []), judge_turns.get(s["session_id"], []),
                       rewards_of.get(s["session_id"], []), groups.get(s["group_id"] or ""), matches,
                       run["experiment_hash"])
               for s in sessions]
    model_usage: dict[str, ModelUsage] = {}
    role_usage: dict[str, ModelUsage] = {}
    role_models: dict[str, list[str]] = defaultdict(list)
    for sample in samples:
        for name, u in sample.model_usage.items():
            model_usage[name] = _add(model_usage.get(name), u)
        for name, u in sample.role_usage.items():
            role_usage[name] = _add(role_usage.get(name), u)
        for ev in sample.events:
            if getattr(ev, "event", None) == "model" and ev.model not in role_models[ev.role]:
                role_models[ev.role].append(ev.model)
    model_roles: dict[str, Any] = {}
    for role, names in role_models.items():
        configs = [ModelConfig(model=n) for n in names]
        model_roles[role] = configs[0] if len(configs) == 1 else configs
    trained = [r for r, info in roles.items() if info.get("trained") and r in role_models]
    main_role = trained[0] if trained else next(iter(role_models), None)
    scores = []
    for key in sorted({k for s in samples for k in (s.scores or {}) if k != "outcome"}):
        values = [float(s.scores[key].value) for s in samples if s.scores and key in s.scores]
        scores.append(EvalScore(name=key, scorer="askspec", scored_samples=len(values),
                                unscored_samples=len(samples) - len(values),
                                metrics={"mean": EvalMetric(name="mean", value=sum(values) / len(values))}))
    status: Any = {"finished": "success", "running": "started", "interrupted": "cancelled"}.get(run["status"], "error")
    ok = sum(1 for s in sessions if s["status"] == "ok")
    spec = EvalSpec(
        run_id=run["run_id"], created=_iso(run["started_at"]) or _iso(sessions[0]["started_at"]),
        task=f"{run['experiment']}/{game}", task_id=run["run_id"][-6:], task_version=0, task_file=None,
        dataset=EvalDataset(name=run["experiment"], samples=len(samples),
                            sample_ids=[s.id for s in samples]),
        model=role_models[main_role][0] if main_role else "none",
        model_roles=model_roles or None, config=EvalConfig(),
        packages={"askspec": str((json_value(run["versions"]) or {}).get("askspec", ""))},
        metadata={"askspec": {"run_id": run["run_id"], "experiment": run["experiment"], "game": game,
                              "experiment_hash": run["experiment_hash"], "seed": run["seed"],
                              "params": json_value(run["params"]), "overrides": json_value(run["overrides"]),
                              "roles": roles, "status": run["status"]}})
    return EvalLog(
        eval=spec, status=status,
        results=EvalResults(total_samples=len(samples), completed_samples=ok, scores=scores),
        stats=EvalStats(started_at=_iso(run["started_at"]), completed_at=_iso(run["ended_at"]),
                        model_usage=model_usage, role_usage=role_usage),
        samples=samples)


def session_finals(rewards: list[dict], group: dict | None) -> tuple[dict[str, float], str | None]:
    """A session's reward per role as the trainer uses it (runtime/train/batch.py), from its
    `rewards` rows and its `groups` row: the per-turn rewards, and of the terminal ones the
    routed contest's where the group was routed for the role, else the others; and the role
    the group was routed for (None)."""
    stats = json_value(group["stats"]) if group is not None else None
    routed = group is not None and str(group["route"]).split(":", 1)[0] in ROUTED
    routed_role = (stats or {}).get("role") if routed else None
    final: dict[str, float] = defaultdict(float)
    for r in rewards:
        if reward_counts(r["turn_index"], r["name"], r["role"] == routed_role):
            final[r["role"]] += r["value"]
        else:
            final.setdefault(r["role"], 0.0)
    return dict(final), routed_role


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b.model_copy()
    return a.model_copy(update={"input_tokens": a.input_tokens + b.input_tokens,
                                "output_tokens": a.output_tokens + b.output_tokens,
                                "total_tokens": a.total_tokens + b.total_tokens})


def _messages(prompt: Any) -> list[Any]:
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser

    kinds = {"system": ChatMessageSystem, "assistant": ChatMessageAssistant}
    return [kinds.get(m.get("role"), ChatMessageUser)(content=str(m.get("content", ""))) for m in prompt or []]


def _sample(s: dict, turns: list[dict], judge_turns: list[dict], rewards: list[dict], group: dict | None,
            matches: list[dict], ehash: str) -> Any:
    from inspect_ai.event import ModelEvent, SpanBeginEvent, SpanEndEvent
    from inspect_ai.log import EvalError, EvalSample
    from inspect_ai.model import (ChatCompletionChoice, ChatMessageAssistant, ChatMessageUser, GenerateConfig,
                                  ModelOutput, ModelUsage)
    from inspect_ai.scorer import Score

    sid = s["session_id"]
    messages: list[Any] = []
    events_of: dict[str, list[Any]] = defaultdict(list)
    model_usage: dict[str, ModelUsage] = {}
    role_usage: dict[str, ModelUsage] = {}
    for span, t in [(t["role"], t) for t in turns] + [(f"{t['role']} (group {t['group_id']})", t)
                                                      for t in judge_turns]:
        prompt = json_value(t["prompt"]) or []
        text = t["text"] or ""
        meta = {"role": t["role"], "turn_index": t["turn_index"], "session_id": t["session_id"]}
        if t["group_id"] is None:  # the transcript: what each ask sent last, and the reply
            last = prompt[-1] if prompt else None
            if last is not None and last.get("role") == "user":
                messages.append(ChatMessageUser(content=str(last.get("content", "")), metadata=meta))
            messages.append(ChatMessageAssistant(content=text, model=t["model"], metadata=meta))
        usage = ModelUsage(input_tokens=t["tokens_in"] or 0, output_tokens=t["tokens_out"] or 0,
                           total_tokens=(t["tokens_in"] or 0) + (t["tokens_out"] or 0))
        model_usage[t["model"]] = _add(model_usage.get(t["model"]), usage)
        role_usage[t["role"]] = _add(role_usage.get(t["role"]), usage)
        reply = ChatMessageAssistant(content=text, model=t["model"])
        output = ModelOutput(model=t["model"], completion=text, usage=usage, error=t["error"],
                             time=(t["latency_ms"] / 1000.0) if t["latency_ms"] is not None else None,
                             choices=[ChatCompletionChoice(message=reply, stop_reason=STOP_REASONS.get(
                                 t["finish_reason"] or "", "unknown"))])
        events_of[span].append(ModelEvent(model=t["model"], role=t["role"], input=_messages(prompt), tools=[],
                                          tool_choice="none", config=GenerateConfig(), output=output,
                                          error=t["error"], timestamp=t["ts"], metadata=meta))
    events: list[Any] = []
    for span, evs in events_of.items():
        span_id = f"{sid}:{span}"
        events.append(SpanBeginEvent(id=span_id, name=span, type="agent", timestamp=evs[0].timestamp))
        for ev in evs:
            ev.span_id = span_id
            events.append(ev)
        events.append(SpanEndEvent(id=span_id, span_id=span_id, timestamp=evs[-1].timestamp))
    scores: dict[str, Score] = {}
    per_role: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rewards:
        name = r["name"] if r["turn_index"] is None else f"{r['name']}@{r['turn_index']}"
        per_role[r["role"]][name] = per_role[r["role"]].get(name, 0.0) + r["value"]
    final, routed_role = session_finals(rewards, group)
    for role, parts in per_role.items():
        scores[f"reward/{role}"] = Score(value=final[role], metadata={"rewards": parts,
                                                                     "routed": role == routed_role})
    if s["outcome"] is not None:
        scores["outcome"] = Score(value=s["outcome"])
    sample_meta: dict[str, Any] = {"session_id": sid, "game": s["game"], "index": s["index"], "attempt": s["attempt"],
                            "status": s["status"], "outcome": s["outcome"], "params": json_value(s["params"]),
                            "vars": json_value(s["vars"]), "seed": s["seed"], "experiment_hash": ehash,
                            "stage": s["stage"], "step": s["step"], "weights": s["weights"]}
    if group is not None:
        sample_meta["group"] = {"group_id": group["group_id"], "route": group["route"], "stats": json_value(group["stats"]),
                         "members": list(group["members"] or []), "judge_calls": group["judge_calls"],
                         "unparsed": group["unparsed"],
                         "judge_turns_in": (group["members"] or [None])[0],
                         "matches": [{k: m[k] for k in ("a", "b", "first_shown", "verdict", "outcome", "raw")}
                                     for m in matches if m["group_id"] == group["group_id"] and sid in (m["a"], m["b"])]}
    params = json_value(s["params"])
    first = next((m for m in messages if m.role == "user"), None)
    started, ended = s["started_at"], s["ended_at"]
    return EvalSample(
        id=sid, epoch=1, input=first.text if first is not None else json.dumps(params, sort_keys=True, default=str),
        target="", messages=messages, scores=scores or None, metadata=sample_meta,
        events=events, model_usage=model_usage, role_usage=role_usage,
        started_at=_iso(started) or None, completed_at=_iso(ended) or None,
        total_time=(ended - started).total_seconds() if started is not None and ended is not None else None,
        error=EvalError(message=s["error"], traceback="", traceback_ansi="") if s["status"] == "error" else None)
