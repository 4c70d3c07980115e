"""Which sessions a training step plays (`StepPlanner`): the trained games' elements in
plan order, cycling, in whole groups, `batch` sessions a step (both the lowered phase's:
askspec/lang/phases.py; the walk itself is `step_elements`); each group's place in the
schedule (`Draw`), which names its sessions' seeds and group id, so that a resumed run
replays the same step under the same seeds; and the groups played in place of resampled
ones (`refill`).

This is the one driver of what a step plays: the local trainer plans by it, and an
OpenRLHF job writes its walk and each group's `Draw` into its prompt lines
(targets/openrlhf/generate.py, phase_data.py), whose agent builds the group's sessions
with `Draw.sessions` as the trainer does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

from askspec.ir import model as ir

from askspec.runtime.engine.plan import SessionPlan, bind, derive_seed


@dataclass(frozen=True)
class Element:
    game: ir.Game
    item_index: int
    bindings: dict[str, Any]
    size: int  # sessions of this element in one step (its group)


@dataclass(frozen=True)
class Draw:
    """Where one group of a training step lies in the schedule: what its sessions' seeds
    and group id follow from. `train`: a planned group, the `at`-th of global step `step`,
    on its element's `epoch`-th pass; `replay`: the `at`-th item a step replays from a
    buffer; `refill`: the `at`-th group of a step's refill `round`."""

    kind: Literal["train", "replay", "refill"]
    step: int  # global, 1-based
    at: int
    epoch: int = 0
    round: int = 0

    def group_id(self, game: str, size: int) -> str | None:
        if size <= 1:
            return None
        refill = f"-r{self.round}" if self.kind == "refill" else ""
        return f"{game}-t{self.step:06d}{refill}-e{self.at:03d}"

    def seed(self, base: int, game: str, item: int, member: int) -> int:
        parts: tuple[Any, ...]
        if self.kind == "train":
            parts = ("train", self.step, self.epoch)
        elif self.kind == "replay":
            parts = ("replay", self.step)
        else:
            parts = ("refill", self.step, self.round, self.at)
        return derive_seed(base, game, item, *parts, member)

    def sessions(self, base: int, game: str, item: int, bindings: dict[str, Any], size: int, first: int,
                 name: Callable[[int], str] = lambda k: f"s{k:06d}", item_index: int | None = None,
                 members: range | None = None) -> list[SessionPlan]:
        """The group's sessions (`members`, all `size` by default), numbered from `first`
        (index k is named `name(k)`)."""
        group_id = self.group_id(game, size)
        return [SessionPlan(index=first + i, session_id=name(first + i), game=game, group_id=group_id,
                            group_size=size, bindings=bindings, step=self.step,
                            seed=self.seed(base, game, item, member), item_index=item_index)
                for i, member in enumerate(members if members is not None else range(size))]

    def label(self) -> dict[str, Any]:
        """The draw as a job's prompt line carries it (`from_label` reads it back)."""
        return {"kind": self.kind, "step": self.step, "at": self.at, "epoch": self.epoch, "round": self.round}

    @classmethod
    def from_label(cls, data: Any) -> "Draw | None":
        """The draw a prompt line's label carries; None for a line without one (or a malformed one)."""
        if not isinstance(data, dict) or data.get("kind") not in ("train", "replay", "refill"):
            return None
        try:
            return cls(data["kind"], int(data["step"]), int(data["at"]), int(data.get("epoch", 0)),
                       int(data.get("round", 0)))
        except (KeyError, TypeError, ValueError):
            return None


def step_elements(sizes: list[int], pos: int, batch: int) -> int:
    """How many elements a step starting at element position `pos` takes: in plan order,
    cycling over `sizes` (each element's group), until its sessions reach `batch`."""
    count = sessions = 0
    while sessions < batch:
        sessions += sizes[(pos + count) % len(sizes)]
        count += 1
    return count


# Refill sessions are numbered apart from the plan's (whose indices count up from 0), so
# that their indices, which seed nothing but must be unique, never meet a planned session's.
REFILL_INDEX = 1 << 40
# A step whose groups keep being resampled stops after this many refill rounds (DAPO's
# max_num_gen_batches): every loop of a run is bounded.
MAX_REFILL_ROUNDS = 8


class StepPlanner:
    """Sessions of each training step: elements in plan order, cycling, whole groups."""

    def __init__(self, exp: ir.Experiment, games: list[ir.Game], params: dict[str, Any], collections: dict[str, list],
                 seed: int, groups: Mapping[str, int], batch: int) -> None:
        """`groups` (each game's sessions of one group) and `batch` (a step's sessions, at
        least) are a lowered phase's (ir.TrainPhase)."""
        from askspec.runtime.engine.evaluator import Env, evaluate

        self.seed = seed
        self.elements: list[Element] = []
        for game in games:
            items: list[Any] = [None]  # a game without `for`: one element, no bindings
            if game.iter is not None:
                items = evaluate(game.iter, Env(vars={}, params=params, collections=collections))
                if not isinstance(items, list):
                    raise ValueError(f"game {game.name}: 'for' did not produce a list")
            size = groups[game.name]
            for k, item in enumerate(items):
                self.elements.append(Element(game, k, bind(game, item), size))
        if not self.elements:
            raise ValueError("the trained games plan no sessions (an empty data set?)")
        self.batch = batch
        self._sizes = [e.size for e in self.elements]
        self._starts: list[tuple[int, int]] = [(0, 0)]  # per step: (first element position, first index)

    @classmethod
    def elements_of(cls, exp: ir.Experiment, games: list[ir.Game], params: dict[str, Any],
                    collections: dict[str, list]) -> list[Element]:
        """The games' elements in plan order, each in the game's own groups (its `sample N`):
        what an evaluate stage and a retrain stage's sample game play."""
        return cls(exp, games, params, collections, 0, {g.name: g.group_size for g in games}, 1).elements

    def _bounds(self, step: int) -> tuple[int, int, int]:
        """(first element position, element count, first session index) of 1-based `step`."""
        while len(self._starts) < step:
            pos, index = self._starts[-1]
            count = self._take(pos)
            self._starts.append((pos + count, index + self._sessions(pos, count)))
        pos, index = self._starts[step - 1]
        return pos, self._take(pos), index

    def _take(self, pos: int) -> int:
        return step_elements(self._sizes, pos, self.batch)

    def _sessions(self, pos: int, count: int) -> int:
        return sum(self.elements[(pos + i) % len(self.elements)].size for i in range(count))

    def sessions_per_step(self, step: int) -> int:
        return self._sessions(*self._bounds(step)[:2])

    def groups(self, n: int, step: int | None = None) -> list[tuple[Element, Draw]]:
        """The groups of this planner's `n`-th step, each with its draw (`step`: the global
        step, n's own by default)."""
        pos, count, _ = self._bounds(n)
        step = n if step is None else step
        return [(self.elements[(pos + j) % len(self.elements)], Draw("train", step, j, (pos + j) // len(self.elements)))
                for j in range(count)]

    def refill(self, n: int, step: int, round_: int, sessions: int, skip: int) -> list[SessionPlan]:
        """Groups played in place of those a route `resample`d (DAPO-style dynamic sampling,
        reasoning_arena.txt §3): at least `sessions` sessions of the elements that follow
        this planner's `n`-th step's own, after the `skip` elements earlier refills of the
        step used. Their seeds and ids are the (global) step's, the round's and the group's
        place in it own (an element met twice in one round gets two), so a resumed run
        replays them."""
        pos, count, _ = self._bounds(n)
        out: list[SessionPlan] = []
        base = REFILL_INDEX + step * 10_000 + round_ * 1_000
        j = 0
        while len(out) < sessions:
            e = self.elements[(pos + count + skip + j) % len(self.elements)]
            out += Draw("refill", step, j, round=round_).sessions(
                self.seed, e.game.name, e.item_index, e.bindings, e.size, base + len(out),
                lambda k: f"s{step:06d}-r{round_}-{k - base:03d}", item_index=e.item_index)
            j += 1
        return out

    def plans(self, n: int, index0: int | None = None, step: int | None = None) -> list[SessionPlan]:
        """The sessions of this planner's `n`-th step; `index0` (the first session index)
        and `step` (the global step) default to n's own when one planner is the schedule.

        A session's seed follows its element, the pass over the elements (`epoch`), its
        member and the global step: every step samples afresh, whichever phase or stage
        it belongs to (an alternating schedule's phases walk the same elements with
        planners of their own: without the step the second phase would replay the first
        one's seeds), and a resumed run replays the same step under the same seeds. The
        nested loop's planners, all playing in one outer step, have seeds of their own."""
        index = self._bounds(n)[2] if index0 is None else index0
        out: list[SessionPlan] = []
        for e, draw in self.groups(n, step):
            out += draw.sessions(self.seed, e.game.name, e.item_index, e.bindings, e.size, index + len(out))
        return out
