"""Run-level state of `diversity(...)` and `novelty(...)`, and the ordering that keeps it
deterministic.

These built-ins compare a text with the texts seen before at the same call site (Ask-E's
window of recent questions, PasoDoble's question history), so their value depends on
which sessions came first. To make a run reproducible whatever the concurrency, a step
that calls one of them waits until every earlier session of its phase has finished
(`OrderGate`); the calls therefore happen in session order. Each session logs its calls,
so a resumed run replays the finished sessions' texts into the scorers first."""

from __future__ import annotations

import asyncio
import heapq
from typing import Any

from askspec.ir import model as ir
from askspec.ir.builtins import STATEFUL


class StatefulScorers:
    """One scorer per call site: EmbeddingDiversity for `diversity`, JaccardHistory for
    `novelty`."""

    def __init__(self) -> None:
        self._by_site: dict[str, Any] = {}

    def _scorer(self, fn: str, site: str, kwargs: dict) -> Any:
        scorer = self._by_site.get(site)
        if scorer is None:
            if fn == "diversity":
                from askspec.runtime.scoring.diversity import EmbeddingDiversity

                scorer = EmbeddingDiversity(alpha=float(kwargs.get("alpha", 1.0)), k=int(kwargs.get("k", 5)),
                                            window=int(kwargs.get("window", 5000)))
            else:
                from askspec.runtime.scoring.diversity import JaccardHistory

                scorer = JaccardHistory(capacity=int(kwargs.get("history", 100)),
                                        tau_sim=float(kwargs.get("tau_sim", 0.3)))
            self._by_site[site] = scorer
        return scorer

    def __call__(self, fn: str, site: str, text: str, kwargs: dict) -> float:
        """Score `text` against the site's history, then add it."""
        scorer = self._scorer(fn, site, kwargs)
        if fn == "diversity":
            return float(scorer.score_and_add(text))
        return float(scorer.r_div_and_add(text))

    def replay(self, fn: str, site: str, text: str, kwargs: dict) -> None:
        """Add a text seen by an earlier (finished) session, without scoring it."""
        self._scorer(fn, site, kwargs).add(text)


class OrderGate:
    """Lets a session proceed once every earlier session of the phase has finished."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._heap: list[int] = []
        self._finished: set[int] = set()

    def reset(self, unfinished: list[int]) -> None:
        self._heap = sorted(unfinished)
        self._finished = set()

    def started(self, index: int) -> None:
        """A session of the phase started (sessions start in index order, lazily)."""
        heapq.heappush(self._heap, index)

    def _lowest(self) -> float:
        while self._heap and self._heap[0] in self._finished:
            self._finished.discard(heapq.heappop(self._heap))
        return self._heap[0] if self._heap else float("inf")

    async def wait_for_earlier(self, index: int) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self._lowest() >= index)

    async def finished(self, index: int) -> None:
        async with self._cond:
            self._finished.add(index)
            self._cond.notify_all()


def calls_stateful(step: Any) -> bool:
    """Whether a step's own expressions (not those of nested bodies) call diversity/novelty."""

    def walk(value: Any) -> bool:
        if isinstance(value, ir.CallFn) and value.fn in STATEFUL:
            return True
        if isinstance(value, (ir.Node, ir.CaseArm, ir.Branch)):
            return any(walk(getattr(value, name)) for name in type(value).model_fields
                       if name not in ("body", "orelse", "span"))
        if isinstance(value, list):
            return any(walk(v) for v in value)
        if isinstance(value, dict):
            return any(walk(v) for v in value.values())
        return False

    if isinstance(step, ir.IfStep):  # only its conditions; branch bodies are steps of their own
        return any(walk(b.cond) for b in step.branches)
    return walk(step)
