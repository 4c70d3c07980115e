"""Which sessions a training step plays (`StepPlanner`): the trained games' elements in
plan order, cycling, in whole groups, `batch` sessions a step (both the lowered phase's:
askspec/lang/phases.py); each session's id, index and seed, so that a resumed run
replays the same step under the same seeds; and the groups played in place of resampled
ones (`refill`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from askspec.ir import model as ir

from askspec.runtime.engine.plan import SessionPlan, derive_seed


@dataclass(frozen=True)
class Element:
    game: ir.Game
    item_index: int
    bindings: dict[str, Any]
    size: int  # sessions of this element in one step (its group)


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
                if game.pattern and len(game.pattern) == 1:
                    bindings = {game.pattern[0]: item}
                elif game.pattern:
                    bindings = dict(zip(game.pattern, list(item)))
                else:
                    bindings = {}
                self.elements.append(Element(game, k, bindings, size))
        if not self.elements:
            raise ValueError("the trained games plan no sessions (an empty data set?)")
        self.batch = batch
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
            count, sessions = self._take(pos)
            self._starts.append((pos + count, index + sessions))
        pos, index = self._starts[step - 1]
        count, _ = self._take(pos)
        return pos, count, index

    def _take(self, pos: int) -> tuple[int, int]:
        count = sessions = 0
        while sessions < self.batch:
            sessions += self.elements[(pos + count) % len(self.elements)].size
            count += 1
        return count, sessions

    def sessions_per_step(self, step: int) -> int:
        pos, count, _ = self._bounds(step)
        return sum(self.elements[(pos + i) % len(self.elements)].size for i in range(count))

    def refill(self, n: int, step: int, round_: int, sessions: int, skip: int) -> list[SessionPlan]:
        """Groups played in place of those a route `resample`d (DAPO-style dynamic sampling,
        reasoning_arena.txt §3): at least `sessions` sessions of the elements that follow
        this planner's `n`-th step's own, after the `skip` elements earlier refills of the
        step used. Their seeds and ids are the (global) step's, the round's and the group's
        place in it own (an element met twice in one round gets two), so a resumed run
        replays them."""
        pos, count, _ = self._bounds(n)
        out: list[SessionPlan] = []
        j = 0
        while len(out) < sessions:
            at = pos + count + skip + j
            e = self.elements[at % len(self.elements)]
            group_id = f"{e.game.name}-t{step:06d}-r{round_}-e{j:03d}" if e.size > 1 else None
            for member in range(e.size):
                k = len(out)
                out.append(SessionPlan(index=REFILL_INDEX + step * 10_000 + round_ * 1_000 + k,
                                       session_id=f"s{step:06d}-r{round_}-{k:03d}", game=e.game.name, group_id=group_id,
                                       group_size=e.size, bindings=e.bindings, step=step,
                                       seed=derive_seed(self.seed, e.game.name, e.item_index, "refill", step, round_, j,
                                                        member),
                                       item_index=e.item_index))
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
        pos, count, index = self._bounds(n)
        index = index if index0 is None else index0
        step = n if step is None else step
        out: list[SessionPlan] = []
        for j in range(count):
            e = self.elements[(pos + j) % len(self.elements)]
            epoch = (pos + j) // len(self.elements)
            group_id = f"{e.game.name}-t{step:06d}-e{j:03d}" if e.size > 1 else None
            for member in range(e.size):
                k = index + len(out)
                out.append(SessionPlan(index=k, session_id=f"s{k:06d}", game=e.game.name, group_id=group_id,
                                       group_size=e.size, bindings=e.bindings, step=step,
                                       seed=derive_seed(self.seed, e.game.name, e.item_index, "train", step, epoch,
                                                        member)))
        return out
