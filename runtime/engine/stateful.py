"""Run-level state of `diversity(...)` and `novelty(...)`, and the ordering that keeps it
deterministic.

These built-ins compare a text with the texts seen before at the same call site (Ask-E's
window of recent questions, PasoDoble's question history), so their value depends on
which sessions came first. To make a run reproducible whatever the concurrency, a step
that calls one of them waits until every earlier session of its phase has finished
(`OrderGate`); the calls therefore happen in session order. Each session logs its calls,
so a resumed run replays the finished sessions' texts into the scorers first.

`SharedHistory` is the history of several processes that play one phase together (an
OpenRLHF job's agents, one per vLLM engine, on any node): one append-only file they all
read before they score and append to after, under a lock."""

from __future__ import annotations

import asyncio
import fcntl
import heapq
import json
import os
from pathlib import Path
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


class SharedHistory(StatefulScorers):
    """Scorers whose history is the file at `path`, shared by every process that opens it.

    A call locks the file (a POSIX record lock, which NFS carries between nodes), first
    replays the texts other processes appended since this one last read, then scores its
    own text and appends it as one line ([fn, site, text, kwargs, launch]). So every
    process scores against every earlier call of every process, in the order the calls
    took the lock. `launch` tags this process's lines (an OpenRLHF job's launch of a
    phase); with `earlier_launches` False only lines of the same launch are replayed (the
    earlier phases' calls come another way, in session order: history.json). A line cut
    short by a killed writer is skipped (the next writer starts a new line after it); the
    file is opened on the first call, its folder made if missing."""

    def __init__(self, path: str | os.PathLike[str], launch: str = "", earlier_launches: bool = True) -> None:
        super().__init__()
        self.path = Path(path)
        self.launch = launch
        self.earlier_launches = earlier_launches
        self._read = 0  # bytes of the file already replayed or written by this process
        self._file: Any = None  # opened on the first call, kept for the process's others

    def __call__(self, fn: str, site: str, text: str, kwargs: dict) -> float:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a+b")
        f = self._file
        fcntl.lockf(f, fcntl.LOCK_EX)
        try:
            tail = self._catch_up(f)
            value = super().__call__(fn, site, text, kwargs)
            line = json.dumps([fn, site, text, kwargs, self.launch], ensure_ascii=False).encode("utf-8") + b"\n"
            f.write(line if tail in (b"", b"\n") else b"\n" + line)
            f.flush()
            self._read = f.tell()
        finally:
            fcntl.lockf(f, fcntl.LOCK_UN)
        return value

    def _catch_up(self, f: Any) -> bytes:
        """Replay the lines written since this process last read; the file's last byte."""
        f.seek(self._read)
        data = f.read()
        for raw in data.split(b"\n"):
            try:
                fn, site, text, kwargs, launch = json.loads(raw)
            except (ValueError, TypeError):
                continue  # empty, or a line a killed writer left unfinished
            if self.earlier_launches or launch == self.launch:
                self.replay(fn, site, text, kwargs)
        if data:
            return data[-1:]
        if self._read:
            f.seek(self._read - 1)
            return f.read(1)
        return b""


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
