"""Trace tournaments (Reasoning Arena, papers/reasoning_arena.txt §4).

A group of N traces is ranked by a pairwise judge. Each judged pair yields a verdict
A / B / Tie for the trace shown first, mapped to the soft outcome gamma / 1/2 / 1 - gamma
(Eq. 7). Presentation order is randomised per pair (order debiasing); every match is
mirrored (j, i, 1 - o) before aggregation. Two pairing rules:

* ``round_robin``: all C(N, 2) pairs (28 judge calls for N = 8), aggregated by win rate
  (Eq. 8) in the paper;
* ``live``: traces arrive one at a time; each new trace meets the current best, worst
  and median of the traces already arrived, ranked on a live leaderboard by win rate
  (§4: "based on a live leaderboard ranked by R_wr(y_i) progressively"). Opponents are
  deduplicated, so arrival k (1-based) meets min(k - 1, 3) traces: at most
  1 + 2 + 3 (N - 3) calls (18 for N = 8, App. B "Setups"). Aggregated by a Bradley-Terry
  fit on the incomplete graph (Eqs. 9-10) then min-max normalisation.

Determinism: the presentation order of a pair is drawn from a generator seeded by
(seed, pair) only, and results are assembled in pair order, so concurrent judge calls
finishing in any order give the same result.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Literal

import numpy as np

from askspec.runtime.replies.parsers import last_boxed  # the one \boxed{} reader, shared with reply parsing
from askspec.runtime.scoring.bradley_terry import fit_bradley_terry, minmax_normalise, mirror, win_rates

Judge = Callable[[str, str, int], Awaitable[str]]
Pairing = Literal["round_robin", "live"]
Aggregate = Literal["win_rate", "bradley_terry"]
# "random" is the paper's rule; "both" judges every pair in both orders (exact
# permutation calibration, 2x calls); "fixed" shows the lower index / the newcomer
# first and exists only as an ablation showing why randomisation matters.
Order = Literal["random", "both", "fixed"]

VERDICTS = ("A", "B", "Tie")


# --------------------------------------------------------------------------- parsing

# LaTeX text wrappers a judge may put inside the box: \boxed{\text{A}}, \textbf{Tie}, ...
_WRAPPER = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|operatorname|mbox)\s*\{([^{}]*)\}")
_PREFIX = re.compile(r"^(?:response|responses|trace|answer|option|solution|candidate|verdict)\s*[:\-]?\s*",
                     re.IGNORECASE)


def _clean_box(content: str) -> str:
    s = content
    for _ in range(3):  # nested wrappers such as \text{\textbf{A}}
        s = _WRAPPER.sub(r"\1", s)
    s = s.replace("$", "").replace("\\,", " ").replace("\\ ", " ").replace("~", " ")
    s = s.strip().strip("\"'`*").strip()
    s = _PREFIX.sub("", s)
    # trailing sentence punctuation only: a leading "." belongs to numbers like ".5"
    return s.strip().strip(")([]\"'`*").rstrip(".!:;,").strip()


def parse_verdict(text: str, labels: Sequence[str] = VERDICTS) -> str | None:
    """The verdict in the judge reply's last ``\\boxed{}``, as one of ``labels``.

    Case-insensitive; tolerates ``\\boxed{\\text{A}}``, ``\\boxed{Response A}``,
    ``\\boxed{tie.}``. Only the last box counts (earlier ones may quote the instructions:
    "end with one of \\boxed{A}, \\boxed{B}, or \\boxed{Tie}"). None if it is unparseable.
    """
    content = last_boxed(text)
    if content is None:
        return None
    cleaned = _clean_box(content).casefold()
    for label in labels:
        if cleaned == label.casefold():
            return label
    return None


_POINTWISE = {0.0, 0.5, 1.0}


def parse_pointwise(text: str, scores: Sequence[float] | None = None) -> float | None:
    """Pointwise judge score (App. D "Pointwise prompt"): 0, 0.5 or 1 from the last box.

    Accepts ``0``, ``0.5``, ``.5``, ``1``, ``1.0``, ``1/2`` and ``\\frac{1}{2}``; anything
    else (other numbers, text, no box) is None. ``scores`` replaces the allowed values
    (a spec's `judge { scores = [...] }`).
    """
    content = last_boxed(text)
    if content is None:
        return None
    s = _clean_box(content).replace(" ", "")
    frac = re.fullmatch(r"\\[dt]?frac\{?(\d+)\}?\{?(\d+)\}?", s) or re.fullmatch(r"(\d+)/(\d+)", s)
    try:
        if frac:
            den = int(frac.group(2))
            value = int(frac.group(1)) / den if den else math.nan
        else:
            value = float(s)
    except ValueError:
        return None
    allowed = _POINTWISE if scores is None else {float(x) for x in scores}
    return value if value in allowed else None


# --------------------------------------------------------------------------- results

@dataclass
class Match:
    """One judged pair. ``outcome`` is o_ab, the soft outcome for trace ``a`` against ``b``
    (None when skipped). ``first_shown`` is the trace shown as "Response A"."""

    a: int
    b: int
    first_shown: int
    verdict: str | None = None
    outcome: float | None = None
    raw_reply: str = ""
    attempts: int = 0
    skipped: bool = False


@dataclass
class TournamentResult:
    scores: list[float]          # normalised rewards in [0, 1]
    strengths: list[float]       # win rates or BT log-strengths, before normalisation
    matches: list[Match]
    judge_calls: int
    aggregate: str = "win_rate"
    pairing: str = "round_robin"

    def observed(self) -> list[tuple[int, int, float]]:
        """Non-skipped matches as (a, b, o_ab), before mirroring."""
        return [(m.a, m.b, m.outcome) for m in self.matches if not m.skipped and m.outcome is not None]

    def mirrored(self) -> list[tuple[int, int, float]]:
        return mirror(self.observed())


@dataclass(frozen=True)
class GroupStats:
    count: int
    sum: float
    mean: float
    var: float
    std: float
    min: float
    max: float
    all_equal: bool
    any_positive: bool


def group_stats(values: Sequence[float]) -> dict[str, float | int | bool]:
    """Summary of one rollout group's rewards, for routing (reasoning_arena.txt Eqs. 2-3).

    Keys: ``count``, ``sum``, ``mean``, ``var`` (population variance, as sigma_G^2 in
    Eq. 2), ``std``, ``min``, ``max``, ``all_equal`` (every value equal: the group is
    non-diverse, D(G) = 0), ``any_positive`` (some value > 0, e.g. "not all-incorrect").
    ``var`` is exactly 0.0 when ``all_equal`` (floating-point mean of equal values need not
    equal the value, which would give a spurious tiny variance). Empty groups raise.
    """
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError("group_stats needs a non-empty 1-D sequence")
    if not np.all(np.isfinite(a)):
        raise ValueError("group rewards must be finite")
    all_equal = bool(np.all(a == a[0]))
    mean = float(a[0]) if all_equal else float(a.mean())
    var = 0.0 if all_equal else float(np.mean((a - mean) ** 2))
    stats = GroupStats(count=int(a.size), sum=float(a.sum()), mean=mean, var=var,
                       std=math.sqrt(var), min=float(a.min()), max=float(a.max()),
                       all_equal=all_equal, any_positive=bool(np.any(a > 0)))
    return asdict(stats)


def round_robin_pairs(n: int) -> list[tuple[int, int]]:
    """All C(n, 2) unordered pairs (i < j), in lexicographic order."""
    return list(combinations(range(n), 2))


def live_call_bound(n: int) -> int:
    """Judge calls of a live tournament with three anchors: 0, 1, 3 for n = 1, 2, 3 and
    1 + 2 + 3 (n - 3) after (reasoning_arena.txt App. B: 18 for N = 8)."""
    return sum(min(k, 3) for k in range(n))


def leaderboard(arrived: Sequence[int], rates: np.ndarray) -> list[int]:
    """Arrived traces best-first by win rate; equal rates keep arrival order."""
    position = {t: k for k, t in enumerate(arrived)}
    return sorted(arrived, key=lambda t: (-float(rates[t]), position[t]))


ANCHORS = ("best", "worst", "median")


def live_opponents(board: Sequence[int], anchors: Sequence[str] = ANCHORS) -> list[int]:
    """Best, worst and median (or the `anchors` asked for) of a best-first leaderboard,
    deduplicated, in that order.

    The median is the ceil(m/2)-th best (index (m - 1) // 2): for m >= 3 it is strictly
    between best and worst, so the three anchors are distinct.
    """
    if not board:
        return []
    at = {"best": board[0], "worst": board[-1], "median": board[(len(board) - 1) // 2]}
    picks = [at[a] for a in ANCHORS if a in anchors]
    out: list[int] = []
    for t in picks:
        if t not in out:
            out.append(t)
    return out


# --------------------------------------------------------------------------- driver

def _outcome_for_first(verdict: str, gamma: float) -> float:
    return {"A": gamma, "Tie": 0.5, "B": 1.0 - gamma}[verdict]


def _pair_rng(seed: int, a: int, b: int) -> random.Random:
    # String seeds go through SHA-512 in CPython: stable across runs and PYTHONHASHSEED,
    # and independent of the order in which pairs are scheduled.
    lo, hi = (a, b) if a < b else (b, a)
    return random.Random(f"askspec-tournament:{seed}:{lo}:{hi}")


class _Runner:
    def __init__(self, traces: Sequence[str], judge: Judge, gamma: float, seed: int,
                 retries: int, order: Order, max_concurrency: int | None,
                 labels: Sequence[str] = VERDICTS):
        if not 0.5 < gamma <= 1.0:
            raise ValueError("gamma must be in (1/2, 1] (reasoning_arena.txt Eq. 7)")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if order not in ("random", "both", "fixed"):
            raise ValueError(f"unknown presentation order {order!r}")
        self.traces = list(traces)
        self.judge = judge
        self.gamma = gamma
        self.seed = seed
        self.retries = retries
        self.order = order
        # the spec's verdict labels for (first wins, second wins, tie), e.g. ("A", "B", "Tie")
        self.labels = tuple(labels)
        self._canonical = dict(zip(self.labels, VERDICTS))
        self.judge_calls = 0
        self._sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    def schedule(self, a: int, b: int) -> list[Match]:
        """The match(es) to judge for pair (a, b): presentation order per ``order``."""
        if self.order == "both":
            return [Match(a, b, first_shown=a), Match(a, b, first_shown=b)]
        if self.order == "fixed":
            return [Match(a, b, first_shown=a)]
        first = a if _pair_rng(self.seed, a, b).random() < 0.5 else b
        return [Match(a, b, first_shown=first)]

    async def _call(self, first: str, second: str, attempt: int) -> str:
        self.judge_calls += 1
        if self._sem is None:
            return await self.judge(first, second, attempt)
        async with self._sem:
            return await self.judge(first, second, attempt)

    async def play(self, m: Match) -> Match:
        second = m.b if m.first_shown == m.a else m.a
        first_text, second_text = self.traces[m.first_shown], self.traces[second]
        for attempt in range(self.retries + 1):
            reply = await self._call(first_text, second_text, attempt)
            m.attempts = attempt + 1
            m.raw_reply = reply if isinstance(reply, str) else str(reply)
            verdict = parse_verdict(m.raw_reply, self.labels)
            if verdict is not None:
                m.verdict = verdict
                o_first = _outcome_for_first(self._canonical.get(verdict, verdict), self.gamma)
                m.outcome = o_first if m.first_shown == m.a else 1.0 - o_first
                return m
        m.skipped = True  # unparseable after retries: excluded from aggregation
        return m

    async def play_all(self, matches: list[Match]) -> list[Match]:
        # gather returns in argument order, so the match list is scheduling-independent
        return list(await asyncio.gather(*(self.play(m) for m in matches)))


class LiveTournament:
    """Incremental live tournament: ``await add(trace)`` as each trace finishes.

    The newcomer meets the current best, worst and median (by win rate over the mirrored
    matches so far); its matches run concurrently, and the leaderboard is updated once
    they all finish, so each arrival sees a well-defined leaderboard.
    """

    def __init__(self, *, judge: Judge, gamma: float, seed: int, retries: int = 2,
                 order: Order = "random", max_concurrency: int | None = None,
                 anchors: Sequence[str] = ANCHORS, labels: Sequence[str] = VERDICTS):
        self._runner = _Runner([], judge, gamma, seed, retries, order, max_concurrency, labels)
        self.anchors = tuple(anchors)
        self.matches: list[Match] = []
        # Arrivals are processed one at a time: a trace that finishes while another is
        # being judged waits, so it sees that trace's results on the leaderboard.
        self._arrival = asyncio.Lock()

    @property
    def traces(self) -> list[str]:
        return self._runner.traces

    @property
    def judge_calls(self) -> int:
        return self._runner.judge_calls

    def rates(self) -> np.ndarray:
        obs = [(m.a, m.b, m.outcome) for m in self.matches if not m.skipped and m.outcome is not None]
        return win_rates(len(self.traces), mirror(obs))

    async def add(self, trace: str) -> list[Match]:
        """Judge a newly arrived trace against the current anchors; return its matches."""
        async with self._arrival:
            arrived = list(range(len(self.traces)))
            opponents = live_opponents(leaderboard(arrived, self.rates()), self.anchors)
            new = len(self.traces)
            self._runner.traces.append(trace)
            scheduled = [m for opp in opponents for m in self._runner.schedule(new, opp)]
            played = await self._runner.play_all(scheduled)
            self.matches.extend(played)
            return played

    def result(self, aggregate: Aggregate = "bradley_terry", normalise: bool | None = None,
               l2: float = 1.0) -> TournamentResult:
        return _aggregate(len(self.traces), self.matches, self.judge_calls, aggregate,
                          "live", normalise, l2)


def _aggregate(n: int, matches: list[Match], judge_calls: int, aggregate: Aggregate,
               pairing: str, normalise: bool | None, l2: float) -> TournamentResult:
    obs = [(m.a, m.b, m.outcome) for m in matches if not m.skipped and m.outcome is not None]
    mirrored = mirror(obs)
    if aggregate == "win_rate":
        strengths = win_rates(n, mirrored)
        # Eq. 8: the win rate itself is the reward; min-max only if asked.
        norm = False if normalise is None else normalise
    elif aggregate == "bradley_terry":
        strengths = fit_bradley_terry(n, mirrored, l2=l2)
        norm = True if normalise is None else normalise  # §4: BT strengths are min-max normalised
    else:
        raise ValueError(f"unknown aggregate {aggregate!r}")
    scores = minmax_normalise(strengths) if norm else np.asarray(strengths, dtype=np.float64)
    return TournamentResult(scores=[float(s) for s in scores], strengths=[float(s) for s in strengths],
                            matches=matches, judge_calls=judge_calls, aggregate=aggregate,
                            pairing=pairing)


async def run_tournament(traces: Sequence[str], *, judge: Judge, pairing: Pairing = "round_robin",
                         gamma: float, aggregate: Aggregate | None = None, seed: int = 0,
                         retries: int = 2, order: Order = "random", normalise: bool | None = None,
                         l2: float = 1.0, max_concurrency: int | None = None,
                         anchors: Sequence[str] = ANCHORS, labels: Sequence[str] = VERDICTS) -> TournamentResult:
    """Run a tournament over ``traces`` and aggregate it into per-trace rewards.

    ``judge(first_text, second_text, attempt)`` returns the judge's raw reply; attempt is
    0 for the first try. An unparseable verdict is retried ``retries`` times, then the
    match is marked skipped and excluded. ``aggregate`` defaults to the paper's pairing:
    win rate for round robin, Bradley-Terry for live. ``normalise`` defaults to the paper:
    BT strengths are min-max normalised, win rates are already rewards in [0, 1] (Eq. 8).
    ``gamma`` is required: the paper gives no value, only gamma in (1/2, 1] (Eq. 7).
    Judge exceptions propagate: retrying transport errors is the backend's job.
    ``anchors`` (live only) picks which of best / worst / median a newcomer meets;
    ``labels`` are the verdict labels for (first wins, second wins, tie).
    """
    if aggregate is None:
        aggregate = "win_rate" if pairing == "round_robin" else "bradley_terry"
    if aggregate not in ("win_rate", "bradley_terry"):
        raise ValueError(f"unknown aggregate {aggregate!r}")
    n = len(traces)
    if pairing == "round_robin":
        runner = _Runner(traces, judge, gamma, seed, retries, order, max_concurrency, labels)
        scheduled = [m for a, b in round_robin_pairs(n) for m in runner.schedule(a, b)]
        matches = await runner.play_all(scheduled)
        return _aggregate(n, matches, runner.judge_calls, aggregate, pairing, normalise, l2)
    if pairing == "live":
        live = LiveTournament(judge=judge, gamma=gamma, seed=seed, retries=retries, order=order,
                              max_concurrency=max_concurrency, anchors=anchors, labels=labels)
        for t in traces:
            await live.add(t)
        return live.result(aggregate, normalise, l2)
    raise ValueError(f"unknown pairing {pairing!r}")


__all__ = [
    "Match", "TournamentResult", "GroupStats", "group_stats", "round_robin_pairs",
    "live_call_bound", "leaderboard", "live_opponents", "LiveTournament", "run_tournament",
    "parse_verdict", "parse_pointwise", "VERDICTS",
]
