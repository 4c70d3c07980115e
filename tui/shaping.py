"""Turns rows from the store into what the screens show: transcripts (parsed sections
located in the reply, what was forwarded to whom, recovery turns), a group's route and
matches, metric tables and heatmaps, training series, run comparisons.

Pure functions over plain data (the one exception reads a run's ``ir.json``); no
Textual and no DuckDB, so every rule here is unit-tested directly.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

# the estimators and their group std, the trainer's (askspec.ir.advantages: one reference)
from askspec.ir.advantages import TEXT as ESTIMATOR_TEXT
from askspec.ir.advantages import group_advantages, group_std
from askspec.ir.vocab import CONTEST_ROUTES, STD_ESTIMATORS, reward_counts
from askspec.tui.numbers import number
from askspec.tui.stats import Interval

# -------------------------------------------------------------------------- the IR


@functools.lru_cache(maxsize=32)
def _load_ir_cached(path: str, mtime_ns: int):
    from askspec.ir.canonical import from_json

    return from_json(Path(path).read_text(encoding="utf-8"))


def load_ir(run_dir: str | Path | None):
    """The run's compiled experiment, or None when ir.json is missing or unreadable
    (an older IR version, a partial copy): screens then show what needs no IR."""
    if not run_dir:
        return None
    p = Path(run_dir) / "ir.json"
    try:
        return _load_ir_cached(str(p), p.stat().st_mtime_ns)
    except Exception:
        return None


def role_retries(run_dir: str | Path | None) -> dict[str, int]:
    """Recovery attempts each role may make (its ``retries``, or a JSON reply's own)."""
    exp = load_ir(run_dir)
    if exp is None:
        return {}
    out = {}
    for r in exp.roles:
        n = int(getattr(r.recover, "retries", 0) or 0)
        if r.reply.kind == "json":
            n = max(n, int(r.reply.args.get("retries", 0) or 0))
        out[r.name] = n
    return out


# ---------------------------------------------------------------------- transcripts

@dataclass
class Highlight:
    start: int
    end: int
    label: str  # the parsed field's name, or "answer" for the graded \boxed{}


@dataclass
class Turn:
    index: int
    role: str
    model: str | None
    text: str
    parsed: dict[str, Any]
    prompt: list[dict[str, Any]]
    finish_reason: str | None
    tokens_in: int | None
    tokens_out: int | None
    latency_ms: float | None
    error: str | None
    rewards: list[tuple[str, float]] = field(default_factory=list)
    recovery: bool = False
    sent: str | None = None  # the last user message: what this role was sent
    received_from: list[tuple[str, int, str]] = field(default_factory=list)  # (role, turn, field)
    forwarded_to: list[tuple[str, int, str]] = field(default_factory=list)  # (role, turn, field)
    highlights: list[Highlight] = field(default_factory=list)
    # strings too long to store inline: (JSON path, characters, file under events/)
    stored_aside: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.parsed.get("parsed", True)) and self.error is None


@dataclass
class Transcript:
    run_id: str
    session: dict[str, Any]
    turns: list[Turn]
    terminal_rewards: list[tuple[str, str, float]]  # (role, name, value)
    routed: set[str] = field(default_factory=set)  # roles whose group's route replaced their rewards

    def counts(self, role: str, name: str) -> bool:
        """Whether a terminal reward counts as the trainer counts it: a group routed to a
        tournament or judge for the role replaces its other terminal rewards."""
        return reward_counts(None, name, role in self.routed)

    @property
    def totals(self) -> dict[str, float]:
        """Each role's final reward: per-turn rewards plus the terminal ones that count."""
        out: dict[str, float] = {}
        for t in self.turns:
            for _name, v in t.rewards:
                out[t.role] = out.get(t.role, 0.0) + v
        for role, name, v in self.terminal_rewards:
            if self.counts(role, name):
                out[role] = out.get(role, 0.0) + v
        return out


ROUTED_REWARDS = CONTEST_ROUTES  # the names a group's route writes its rewards under


# Parser bookkeeping fields, not sections of the reply.
_META_FIELDS = {"parsed", "truncated", "answer", "ok"}
_MIN_FORWARD = 6  # shorter values ("2", "yes") would match anywhere


def last_boxed_span(text: str) -> tuple[int, int] | None:
    """Span of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        depth, i = 0, start + len("\\boxed")
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return start, i + 1
            i += 1
        start = text.rfind("\\boxed{", 0, start)
    return None


def find_highlights(text: str, parsed: dict[str, Any]) -> list[Highlight]:
    """Where each parsed section sits in the reply (its last occurrence, as the parsers
    take the last tag), and the graded answer's ``\\boxed{}``."""
    out = []
    for key, value in parsed.items():
        if key in _META_FIELDS or not isinstance(value, str) or not value.strip():
            continue
        v = value.strip()
        i = text.rfind(v)
        if i >= 0:
            out.append(Highlight(i, i + len(v), key))
    span = last_boxed_span(text)
    if span is not None:
        out.append(Highlight(span[0], span[1], "answer"))
    elif isinstance(parsed.get("answer"), str) and parsed["answer"].strip():
        a = parsed["answer"].strip()
        i = text.rfind(a)
        if i >= 0:
            out.append(Highlight(i, i + len(a), "answer"))
    return sorted(out, key=lambda h: h.start)


def _last_user(prompt: Any) -> str | None:
    if not isinstance(prompt, list):
        return None
    for m in reversed(prompt):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else json.dumps(c, ensure_ascii=False)
    return None


def _is_recovery(turn: Turn, prev: Turn | None, retries: int | None) -> bool:
    """A recovery turn re-asks the same role after a reply that did not parse: the engine
    sends the earlier prompt plus that reply and a recovery prompt, or (JSON retries
    without a template) the same prompt again."""
    if prev is None or prev.ok or retries == 0:
        return False
    p, q = turn.prompt, prev.prompt
    if not isinstance(p, list) or not isinstance(q, list):
        return False
    if p == q:
        return True
    return (len(p) == len(q) + 2 and p[:-2] == q and isinstance(p[-2], dict)
            and p[-2].get("role") == "assistant" and p[-2].get("content") == prev.text)


def _aside(records: Any) -> list[tuple[str, int, str]]:
    """The store's ``overflow`` records of a turn (runtime/store/overflow.py)."""
    if not isinstance(records, list):
        return []
    return [(str(r.get("path")), int(r.get("chars") or 0), str(r.get("file")))
            for r in records if isinstance(r, dict)]


def build_transcript(run_id: str, session: dict, turn_rows: list[dict], reward_rows: list[dict],
                     retries: dict[str, int], routed: set[str] | None = None) -> Transcript:
    turns = [
        Turn(index=r["turn_index"], role=r["role"] or "?", model=r["model"], text=r["text"] or "",
             parsed=r["parsed"] if isinstance(r["parsed"], dict) else {},
             prompt=r["prompt"] if isinstance(r["prompt"], list) else [],
             finish_reason=r["finish_reason"], tokens_in=r["tokens_in"], tokens_out=r["tokens_out"],
             latency_ms=r["latency_ms"], error=r["error"], stored_aside=_aside(r.get("overflow")))
        for r in turn_rows
    ]
    by_index = {t.index: t for t in turns}
    terminal = []
    for w in reward_rows:
        t = by_index.get(w["turn_index"]) if w["turn_index"] is not None else None
        if t is not None and (w["kind"] or "turn") == "turn":
            t.rewards.append((w["name"], w["value"]))
        else:
            terminal.append((w["role"], w["name"], w["value"]))
    last_of_role: dict[str, Turn] = {}
    for t in turns:
        t.sent = _last_user(t.prompt)
        t.highlights = find_highlights(t.text, t.parsed)
        t.recovery = _is_recovery(t, last_of_role.get(t.role), retries.get(t.role))
        last_of_role[t.role] = t
    # What was forwarded: a parsed section of one turn that appears in what a later turn
    # of another role was sent. Forwarded text may be cut (words(200)), so match a prefix.
    for i, t in enumerate(turns):
        for key, value in t.parsed.items():
            if key in _META_FIELDS or not isinstance(value, str):
                continue
            probe = value.strip()[:60]
            if len(probe) < _MIN_FORWARD:
                continue
            for u in turns[i + 1:]:
                if u.role != t.role and u.sent and probe in u.sent:
                    t.forwarded_to.append((u.role, u.index, key))
                    u.received_from.append((t.role, t.index, key))
    return Transcript(run_id=run_id, session=session, turns=turns, terminal_rewards=terminal,
                      routed=set(routed or ()))


# --------------------------------------------------------------------------- groups

@dataclass
class GroupDetail:
    group_id: str
    route: str
    role: str | None
    stats: dict[str, Any]
    why: list[str]  # lines: the statistics the route looked at and the arm that fired
    matches: list[dict[str, Any]]
    members: pa.Table  # session, base reward, strength, routed reward, final reward


def _fired_arm(run_dir: str | None, params: dict, group: dict, base: list[float]) -> str | None:
    """The route arm that sent this group where it went, re-evaluated from the IR on the
    group's base rewards; None if the IR is unreadable or no arm agrees with the record."""
    exp = load_ir(run_dir)
    if exp is None:
        return None
    from askspec.ir.render import expr_text
    from askspec.runtime.engine.evaluator import Env, evaluate

    merged = {**exp.param_values(), **(params or {})}  # the manifest holds the values run
    role = (group.get("stats") or {}).get("role")
    for game in exp.games:
        for route in game.routes:
            if role is not None and route.role != role:
                continue
            env = Env(vars={"rewards": base, "size": len(base)}, params=merged)
            for arm in route.arms:
                try:
                    hit = arm.cond is None or bool(evaluate(arm.cond, env))
                except Exception:
                    hit = False
                if not hit:
                    continue
                recorded = arm.action if arm.target is None else f"{arm.action}:{arm.target}"
                if recorded != group.get("route"):
                    break  # this route sends such a group elsewhere: not the one recorded
                cond = "else" if arm.cond is None else f"when {expr_text(arm.cond)}"
                target = f" {arm.target}" if arm.target else ""
                return f"route {route.role} {{ {cond} -> {arm.action}{target} }} in game {game.name}"
    return None


def _num(v: Any) -> str:
    return number(v)


def build_group(group: dict, matches: list[dict], rewards: list[dict], run_dir: str | None,
                params: dict, trained: list[str] | None = None) -> GroupDetail:
    """A group as the trainer saw it: per role it trains on (the route's role, else the
    run's trained roles that were rewarded here, else every rewarded role) each member's
    final reward, the group's statistics and the advantage each member got."""
    stats = group.get("stats") or {}
    role = stats.get("role")
    members = list(group.get("members") or [])
    routed_names = set(ROUTED_REWARDS)
    route = group.get("route") or "?"
    # As the trainer counts them: a tournament/judge route replaces the role's terminal
    # verifier rewards by the routed one; per-turn rewards count either way.
    was_routed = route.split(":", 1)[0] in routed_names
    rewarded = list(dict.fromkeys(w["role"] for w in rewards))
    if role is not None:
        roles = [role]
    else:
        roles = [r for r in trained or [] if r in rewarded] or rewarded
    base: dict[str, float] = {}
    routed: dict[str, float] = {}
    final: dict[str, dict[str, float]] = {r: {} for r in roles}
    for w in rewards:
        if w["role"] not in final:
            continue
        sid = w["session_id"]
        is_routed = w["name"] in routed_names and w.get("turn_index") is None
        if w["role"] == role:
            if is_routed:
                routed[sid] = routed.get(sid, 0.0) + w["value"]
            else:
                base[sid] = base.get(sid, 0.0) + w["value"]
        if reward_counts(w.get("turn_index"), w["name"], was_routed and w["role"] == role):
            final[w["role"]][sid] = final[w["role"]].get(sid, 0.0) + w["value"]
    estimators = train_estimators(run_dir)
    why = []
    if route == "none":
        why.append("no route: the game routes no group, so the trainer keeps every member")
    arm = _fired_arm(run_dir, params, group, [base.get(m, 0.0) for m in members]) if role is not None else None
    if arm:
        why.append(f"arm fired: {arm}")
    if stats.get("count"):  # the statistics the route looked at (its role's base rewards)
        parts = [f"{k} {_num(stats[k])}" for k in ("count", "mean", "var", "std", "min", "max") if k in stats]
        why.append(f"route saw {role or 'rewards'}: " + ", ".join(parts))
    for k in ("pairing", "aggregate", "judge_calls"):
        if k in stats:
            why.append(f"{k}: {stats[k]}")
    advantages: dict[str, list[float | None]] = {}
    for r in roles:
        values = [final[r].get(m) for m in members]
        got = [v for v in values if v is not None]
        est, std_kind = estimators.get(r) or ("", "sample")
        advantages[r] = group_advantages(est, values, std_kind) if est else [None] * len(values)
        line = f"{r}: count {len(got)}"
        if got:
            mean = sum(got) / len(got)
            line += (f", mean {_num(mean)}, std {_num(group_std(got, std_kind))}, min {_num(min(got))}, "
                     f"max {_num(max(got))}")
        if est:
            line += f";  advantage: {est} {ESTIMATOR_TEXT.get(est, '')}"
            if est in STD_ESTIMATORS:
                line += f" ({std_kind} std)"
            if len(got) > 1 and max(got) == min(got) and est not in ("reinforce",):
                line += " — all rewards equal: every advantage is 0 (no learning signal from this group)"
        why.append(line)
    n = len(members)
    given_strengths, given_routed = stats.get("strengths"), stats.get("routed")
    strengths = given_strengths if isinstance(given_strengths, list) else []
    routed_list = given_routed if isinstance(given_routed, list) else []
    cols: dict[str, list] = {"session": members}
    if role is not None:  # what the route looked at and what it gave
        cols["base"] = [r4(base.get(m)) for m in members]
        if strengths or routed_list or routed:
            cols["strength"] = [r4(strengths[i]) if i < len(strengths) else None for i in range(n)]
            cols["routed"] = [r4(routed.get(m, routed_list[i] if i < len(routed_list) else None))
                              for i, m in enumerate(members)]
    for r in roles:
        suffix = f" {r}" if len(roles) > 1 else ""
        cols["final" + suffix] = [r4(final[r].get(m)) for m in members]
        if estimators.get(r):
            cols["advantage" + suffix] = [r4(a) for a in advantages[r]]
    members_table = pa.table({k: pa.array(v, type=pa.string() if k == "session" else pa.float64())
                              for k, v in cols.items()})
    return GroupDetail(group_id=group["group_id"], route=route, role=role, stats=stats, why=why,
                       matches=matches, members=members_table)


def r4(v: float | None) -> float | None:
    """A reward or advantage kept to 4 decimals: the rounding noise of a sum (2.8e-17)
    is 0, not a number to read."""
    return None if v is None else round(float(v), 4) + 0.0  # (+ 0.0: -0.0 is 0)


def train_estimators(run_dir: str | None) -> dict[str, tuple[str, str]]:
    """Role -> (the advantage estimator its `train` block uses, the group std it divides
    by: sample | population), none for sft, from the IR."""
    exp = load_ir(run_dir)
    if exp is None:
        return {}
    from askspec.runtime.train.config import config_from_ir

    out: dict[str, tuple[str, str]] = {}
    for t in exp.training:
        try:
            cfg = config_from_ir(t, exp)
        except Exception:  # an IR the trainer would refuse: nothing to show
            continue
        if cfg.estimator:
            out[t.role] = (cfg.estimator, cfg.std)
    return out


# -------------------------------------------------------------------------- metrics

@dataclass
class Heatmap:
    metric: str
    row_key: str
    col_key: str
    rows: list[str]
    cols: list[str]
    values: dict[tuple[str, str], float | None]
    counts: dict[tuple[str, str], int]


@dataclass
class Metrics:
    tables: dict[str, pa.Table]  # metric name -> by columns + value + n
    heatmaps: list[Heatmap]
    errors: int
    train: dict[str, dict[str, list[tuple[int, float]]]]  # role -> column -> (step, value)
    note: str | None = None
    # every declared metric's rows in one table: metric, by, value, n, 95 % interval
    declared: pa.Table | None = None
    intervals: dict[tuple[str, str], Interval] = field(default_factory=dict)  # (metric, by key) -> interval
    rows: list[dict] = field(default_factory=list)  # evaluate_metrics' rows: metric, by, value, n


# The training curves shown first (the rest, the trainer's bookkeeping, behind a key):
# reward mean ± std, loss, KL, grad norm, share of zero advantages, tokens per second, and the
# sampler-trainer mismatch (float noise when the sampler plays the trained weights)
KEY_CURVES = ("reward_mean", "loss", "kl", "grad_norm", "zero_adv_share", "tokens_per_s", "mismatch_kl")
CURVE_TITLES = {"reward_mean": "reward mean ± std", "zero_adv_share": "zero-advantage share",
                "tokens_per_s": "tokens / s", "grad_norm": "grad norm", "mismatch_kl": "sampler-trainer KL"}
# series that are the x axis again or restate another one
_NOT_CURVES = {"step", "reward_std"}


@dataclass
class Curve:
    """One plot: a title and its lines (label, (step, value) points)."""

    role: str
    column: str
    title: str
    lines: list[tuple[str, list[tuple[int, float]]]]


def curves(train: dict[str, dict[str, list[tuple[int, float]]]], key: bool = True,
           label: str = "") -> list[Curve]:
    """The key curves (``key``) or the other series of each role, in ``KEY_CURVES``
    order; reward mean with lines at ± its std; ``label`` names the lines (a run)."""
    out = []
    for role, series in train.items():
        series = dict(series)
        if "tokens" in series and "seconds" in series and "tokens_per_s" not in series:
            secs = dict(series["seconds"])
            rate = [(x, t / secs[x]) for x, t in series["tokens"] if secs.get(x)]
            if rate:
                series["tokens_per_s"] = rate
        names = [c for c in KEY_CURVES if c in series] if key else \
            [c for c in series if c not in KEY_CURVES and c not in _NOT_CURVES]
        for c in names:
            lines = [(label or c, series[c])]
            if c == "reward_mean" and "reward_std" in series:
                std = dict(series["reward_std"])
                for sign, name in ((1, "+std"), (-1, "-std")):
                    lines.append((f"{label} {name}".strip(), [(x, y + sign * std[x]) for x, y in series[c] if x in std]))
            out.append(Curve(role, c, f"{role}: {CURVE_TITLES.get(c, c)}", lines))
    return out


def _label(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def by_key(metric_by: list[str], by: dict) -> str:
    """A metric row's ``by`` values as the key of its interval (``stats.metric_intervals``)."""
    return json.dumps([by.get(b) for b in metric_by], sort_keys=True, default=str)


def interval_text(iv: Interval | None) -> str | None:
    return None if iv is None else f"{number(iv.lo)} … {number(iv.hi)}"


def declared_table(rows: list[dict], intervals: dict[tuple[str, str], Interval]) -> pa.Table:
    """Every declared metric's rows in one table: metric, by (``a=small, b=mid``),
    value, n and its 95 % interval."""
    values = [r["value"] for r in rows]
    numeric = all(v is None or isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return pa.table({
        "metric": [r["metric"] for r in rows],
        "by": [", ".join(f"{k}={_label(v)}" for k, v in r["by"].items()) or None for r in rows],
        "value": pa.array([float(v) if v is not None else None for v in values] if numeric
                          else [_label(v) for v in values], type=pa.float64() if numeric else pa.string()),
        "n": pa.array([r["n"] for r in rows], type=pa.int64()),
        "95% interval": [interval_text(intervals.get((r["metric"], by_key(list(r["by"]), r["by"])))) for r in rows],
    })


def build_metrics(rows: list[dict], errors: int, steps: list[dict], note: str | None,
                  intervals: dict[tuple[str, str], Interval] | None = None) -> Metrics:
    grouped: dict[str, list[dict]] = {}
    for r in rows:
        grouped.setdefault(r["metric"], []).append(r)
    tables: dict[str, pa.Table] = {}
    heatmaps: list[Heatmap] = []
    for name, rs in grouped.items():
        keys = list(rs[0]["by"].keys())
        cols: dict[str, list] = {k: [_label(r["by"].get(k)) for r in rs] for k in keys}
        numeric = all(v is None or isinstance(v, (int, float)) and not isinstance(v, bool)
                      for v in (r["value"] for r in rs))
        cols["value"] = [r["value"] if numeric else _label(r["value"]) for r in rs]
        cols["n"] = [r["n"] for r in rs]
        tables[name] = pa.table(cols)
        if len(keys) == 2 and numeric:
            rk, ck = keys
            values = {(_label(r["by"][rk]), _label(r["by"][ck])): r["value"] for r in rs}
            counts = {(_label(r["by"][rk]), _label(r["by"][ck])): r["n"] for r in rs}
            heatmaps.append(Heatmap(metric=name, row_key=rk, col_key=ck,
                                    rows=sorted({a for a, _ in values}), cols=sorted({b for _, b in values}),
                                    values=values, counts=counts))
    train: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for s in steps:
        m = s["metrics"]
        if not isinstance(m, dict):
            continue
        for k, v in m.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                train.setdefault(s["role"], {}).setdefault(k, []).append((int(s["step"]), float(v)))
    intervals = intervals or {}
    return Metrics(tables=tables, heatmaps=heatmaps, errors=errors, train=train, note=note,
                   declared=declared_table(rows, intervals) if rows else None, intervals=intervals, rows=rows)


# -------------------------------------------------------------------------- compare

@dataclass
class Comparison:
    settings: pa.Table  # setting, A, B, differs (the ones that differ first)
    results: pa.Table  # what, A, n A, 95% A, B, n B, 95% B, B - A, overlap
    curves: list[Curve]  # the key training curves, A and B overlaid
    differ: list[str]  # the settings that differ


def _setting_rows(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """The settings each run was started with, from its manifest (as `askspec runs` says
    them: runtime/commands/runs.py)."""
    from askspec.runtime.store.describe import models_text

    rows: list[tuple[str, Any, Any]] = [
        ("experiment", a.get("experiment"), b.get("experiment")),
        ("spec hash", (a.get("experiment_hash") or "")[:12], (b.get("experiment_hash") or "")[:12]),
        ("seed", a.get("seed"), b.get("seed")),
    ]
    oa, ob = a.get("run_options") or {}, b.get("run_options") or {}
    for key in ("profile", "backend", "replay", "sessions", "max_tokens", "concurrency", "base_url"):
        if oa.get(key) is not None or ob.get(key) is not None:
            rows.append((key, oa.get(key), ob.get(key)))
    sa, sb = a.get("overrides") or {}, b.get("overrides") or {}
    for key in sorted(set(sa) | set(sb)):
        rows.append((f"--set {key}", sa.get(key), sb.get(key)))
    ra, rb = a.get("roles") or {}, b.get("roles") or {}
    for role in list(dict.fromkeys([*ra, *rb])):
        rows.append((f"model {role}", models_text({role: ra[role]}).removesuffix(f" ({role})") if role in ra else None,
                     models_text({role: rb[role]}).removesuffix(f" ({role})") if role in rb else None))
    pa_, pb = a.get("params") or {}, b.get("params") or {}
    for key in sorted(set(pa_) | set(pb)):
        if key not in sa and key not in sb:  # (a --set value is said above)
            rows.append((f"param {key}", pa_.get(key), pb.get(key)))
    va, vb = a.get("versions") or {}, b.get("versions") or {}
    if va.get("askspec") or vb.get("askspec"):
        rows.append(("askspec version", va.get("askspec"), vb.get("askspec")))
    return rows


def compare_runs(a, b, sa: dict, sb: dict, ma: Metrics, mb: Metrics,
                 rewards_a: dict[str, list[float]], rewards_b: dict[str, list[float]]) -> Comparison:
    """Two runs' settings (``sa``, ``sb``: their manifests' rows), results with n and 95 %
    intervals, and overlaid training curves (``a``, ``b``: RunInfo)."""
    from askspec.tui.stats import mean_interval, wilson

    settings = _setting_rows(sa, sb)
    text = [(w, _label(x) if not isinstance(x, float) else number(x), _label(y) if not isinstance(y, float) else number(y))
            for w, x, y in settings]
    # what differs first: the settings the same in both are listed after them
    text = [r for r in text if r[1] != r[2]] + [r for r in text if r[1] == r[2]]
    settings_table = pa.table({
        "setting": [r[0] for r in text],
        "A": [r[1] for r in text],
        "B": [r[2] for r in text],
        "differs": ["≠" if r[1] != r[2] else "" for r in text],
    })
    rows: list[tuple[str, Any, int | None, Interval | None, Any, int | None, Interval | None]] = [
        ("sessions done", a.done, None, None, b.done, None, None),
        ("sessions errored", a.errors, None, None, b.errors, None, None),
    ]
    na, nb = a.done - a.errors, b.done - b.errors
    for o in sorted(set(a.outcomes) | set(b.outcomes)):
        ka, kb = a.outcomes.get(o, 0), b.outcomes.get(o, 0)
        rows.append((f"rate {o}", ka / na if na else None, na, wilson(ka, na) if na >= 2 else None,
                     kb / nb if nb else None, nb, wilson(kb, nb) if nb >= 2 else None))
    for role in sorted(set(a.mean_reward) | set(b.mean_reward)):
        va, vb = rewards_a.get(role) or [], rewards_b.get(role) or []
        rows.append((f"mean reward {role}", a.mean_reward.get(role), len(va) or None, mean_interval(va),
                     b.mean_reward.get(role), len(vb) or None, mean_interval(vb)))
    ra, rb = _metric_rows(ma), _metric_rows(mb)
    for key in list(dict.fromkeys([*ra, *rb])):
        xa, xb = ra.get(key, (None, None, None)), rb.get(key, (None, None, None))
        rows.append((key, *xa, *xb))
    delta, overlap = [], []
    for _w, x, _n, ia, y, _m, ib in rows:
        num = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
        delta.append(float(y - x) if num else None)
        overlap.append(None if ia is None or ib is None else ("yes" if ia.overlaps(ib) else "no"))

    def shown(v: Any) -> str | None:
        return None if v is None else number(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else _label(v)

    results = pa.table({
        "what": [r[0] for r in rows],
        "A": [shown(r[1]) for r in rows],
        "n A": pa.array([r[2] for r in rows], type=pa.int64()),
        "95% A": [interval_text(r[3]) for r in rows],
        "B": [shown(r[4]) for r in rows],
        "n B": pa.array([r[5] for r in rows], type=pa.int64()),
        "95% B": [interval_text(r[6]) for r in rows],
        "B - A": pa.array(delta, type=pa.float64()),
        "overlap": overlap,
    })
    differ = [r[0] for r in text if r[1] != r[2]]
    return Comparison(settings_table, results, overlay(curves(ma.train, label="A"), curves(mb.train, label="B")),
                      differ)


def overlay(a: list[Curve], b: list[Curve]) -> list[Curve]:
    """One plot per (role, curve) of either run, with each run's line (no ± std bands:
    two runs' lines are what is compared)."""
    out: dict[tuple[str, str], Curve] = {}
    for c in [*a, *b]:
        key = (c.role, c.column)
        title = c.title.replace(" ± std", "")
        got = out.setdefault(key, Curve(c.role, c.column, title, []))
        got.lines.append(c.lines[0])
    return list(out.values())


def _metric_rows(m: Metrics) -> dict[str, tuple[Any, int | None, Interval | None]]:
    """Declared metric rows by their label (``name [a=x, b=y]``): value, n, interval."""
    out: dict[str, tuple[Any, int | None, Interval | None]] = {}
    for r in m.rows:
        by = ", ".join(f"{k}={_label(v)}" for k, v in r["by"].items())
        out[r["metric"] + (f" [{by}]" if by else "")] = (
            r["value"], r["n"], m.intervals.get((r["metric"], by_key(list(r["by"]), r["by"]))))
    return out
