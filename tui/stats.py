"""95 % intervals for the spec's declared metrics, so that a number from 4 sessions is
read as one.

A metric that is a mean (or rate) over sessions, ``mean(x)`` / ``mean(x where c)``, gets
an interval from the values it averaged: Wilson's score interval when they are 0/1
(booleans: an accuracy), else Student's t (mean ± t·s/√n). Any other metric (a ratio of
means, a count, a var) gets a percentile bootstrap over its sessions (``BOOT``
resamples, a fixed seed: the same run shows the same interval), and only while the run
has at most ``BOOT_MAX_SESSIONS`` sessions (it re-evaluates the metric per resample).
No interval for n < 2. Headless: the TUI's data layer calls it in a worker."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

Z95 = 1.959963984540054
BOOT = 200
BOOT_MAX_SESSIONS = 2000
# Student's t, two-sided 95 %, by degrees of freedom (1..30); z beyond
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


@dataclass(frozen=True)
class Interval:
    lo: float
    hi: float
    method: str  # wilson | t | bootstrap

    def overlaps(self, other: Interval) -> bool:
        return self.lo <= other.hi and other.lo <= self.hi


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else Z95


def wilson(successes: float, n: int) -> Interval:
    p = successes / n
    den = 1 + Z95 ** 2 / n
    centre = (p + Z95 ** 2 / (2 * n)) / den
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / den
    return Interval(max(0.0, centre - half), min(1.0, centre + half), "wilson")


def t_interval(values: list[float]) -> Interval:
    n = len(values)
    mean = sum(values) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t95(n - 1) * s / math.sqrt(n)
    return Interval(mean - half, mean + half, "t")


def mean_interval(values: list[Any]) -> Interval | None:
    """The interval of the mean of ``values`` (booleans or 0/1: Wilson; numbers: t)."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))]
    if len(vals) < 2:
        return None
    if all(v in (0.0, 1.0) for v in vals):
        return wilson(sum(vals), len(vals))
    return t_interval(vals)


def _key(metric, scope) -> str:
    return json.dumps([scope.vars.get(b) for b in metric.by], sort_keys=True, default=str)


def _mean_values(metric, sessions: list, params: dict, roles: dict) -> list[Any] | None:
    """The per-session values a ``mean(x)`` metric averages (as the metrics module
    evaluates them), or None when the metric is not a plain mean over sessions."""
    from askspec.ir import model as ir
    from askspec.runtime.engine.metrics import aggregate_values

    e = metric.value
    if not (isinstance(e, ir.CallFn) and e.fn in ("mean", "rate") and len(e.args) == 1):
        return None
    try:
        return aggregate_values(e.args[0], sessions, params, roles)[0]
    except Exception:  # the metric itself reports its error; no interval for it
        return None


def metric_intervals(exp, scopes: list) -> dict[tuple[str, str], Interval]:
    """(metric name, its ``by`` values as JSON) -> the 95 % interval of that row."""
    from askspec.runtime.engine.evaluator import RoleView

    params = exp.param_values()
    roles = {r.name: RoleView(r.name) for r in exp.roles}
    out: dict[tuple[str, str], Interval] = {}
    boot = []
    for m in exp.metrics:
        groups: dict[str, list] = {}
        for s in scopes:
            groups.setdefault(_key(m, s), []).append(s)
        for key, members in groups.items():
            values = _mean_values(m, members, params, roles)
            if values is None:
                boot.append(m)
                break
            iv = mean_interval(values)
            if iv is not None:
                out[(m.name, key)] = iv
    if boot and 2 <= len(scopes) <= BOOT_MAX_SESSIONS:
        out.update(_bootstrap(exp, boot, scopes))
    return out


def _bootstrap(exp, metrics: list, scopes: list) -> dict[tuple[str, str], Interval]:
    from askspec.runtime.engine.metrics import evaluate_metrics

    rng = random.Random(0)
    draws: dict[tuple[str, str], list[float]] = {}
    sizes: dict[tuple[str, str], int] = {}
    for m in metrics:
        one = exp.model_copy(update={"metrics": [m]})
        groups: dict[str, list] = {}
        for s in scopes:
            groups.setdefault(_key(m, s), []).append(s)
        sizes.update(((m.name, k), len(g)) for k, g in groups.items())
        for _ in range(BOOT):  # each row's sessions (its `by` group) resampled
            sample = [rng.choice(g) for g in groups.values() for _ in g]
            for row in evaluate_metrics(one, sample):
                v = row["value"]
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    key = json.dumps([row["by"].get(b) for b in m.by], sort_keys=True, default=str)
                    draws.setdefault((m.name, key), []).append(float(v))
    out = {}
    for k, vs in draws.items():
        if len(vs) >= BOOT // 2 and sizes.get(k, 0) >= 2:
            vs.sort()
            out[k] = Interval(vs[int(0.025 * (len(vs) - 1))], vs[int(round(0.975 * (len(vs) - 1)))], "bootstrap")
    return out
