"""The session plan: which sessions a run consists of, derived from the IR alone.

Each game expands to (items of its `for`) × `times` × `sample` sessions, generated
lazily (`Plan`). Session ids and seeds depend only on the plan position and the run seed,
so a resumed run re-creates exactly the same sessions."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from askspec.ir import model as ir
from askspec.lang.paths import (MAX_DATA_BYTES, MAX_RECORD_BYTES, open_regular, open_spec_file, read_parquet_rows,
                                 record_too_large)
from askspec.ir.plansize import Unknown, cut_total, first_phase, game_sessions, replays_buffer, spec_range

from askspec.runtime.engine.evaluator import Env, EvalError, evaluate


@dataclass(frozen=True)
class SessionPlan:
    index: int
    session_id: str
    game: str
    group_id: str | None
    group_size: int
    bindings: dict[str, Any]  # the game's `for` pattern names -> values
    seed: int
    item_index: int | None = None  # position of the bound item in the game's `for` list
    # set by the trainer (runtime/train), None in an evaluation run: the training step the
    # session is played in, its stage when the spec declares stages, and which weights an
    # evaluate stage's session is served by (trained | initial). The run store records
    # them as the session's own columns (sessions.step, stage, weights), not as bindings.
    step: int | None = None
    stage: str | None = None
    weights: str | None = None


def derive_seed(*parts: Any) -> int:
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "big")


def load_dataset(ds: ir.Dataset, spec_dir: str, seed: int) -> list[Any]:
    if ds.format == "list":
        items = list(ds.items or [])
    else:
        # the checks `check` made (inside the spec's folder, a regular file, size cap),
        # made again on the file actually read: it may have changed since (a --data file,
        # the user's own, is read where it is)
        path = ds.path or ""
        opened = open_regular(path, MAX_DATA_BYTES) if ds.user_file else open_spec_file(spec_dir, path, MAX_DATA_BYTES)
        with opened as raw:
            if ds.format in ("jsonl", "knowledge"):
                items = []
                for n, data in enumerate(raw, 1):
                    if len(data) > MAX_RECORD_BYTES:
                        raise ValueError(f"{path}:{n}: {record_too_large(len(data))}")
                    line = data.decode("utf-8").strip()
                    if not line:
                        continue
                    try:
                        items.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n}: invalid JSON line ({e.msg})") from None
            else:
                items = read_parquet_rows(raw, path)
    split = ds.options.get("split")
    if split is not None:  # keep the items of that split only (SOAR's held-out test split stays out)
        items = [it for it in items if isinstance(it, dict) and it.get("split") == split]
    if ds.filter is not None:
        items = _filtered(ds, items)
    if ds.options.get("shuffle"):
        random.Random(derive_seed(seed, ds.name, ds.options.get("seed", 0))).shuffle(items)
    limit = ds.options.get("limit")
    if isinstance(limit, (int, float)) and limit >= 0:
        items = items[: int(limit)]
    return items


def _filtered(ds: ir.Dataset, items: list[Any]) -> list[Any]:
    """The records a data set's `where` holds for, evaluated by the engine's evaluator (a
    record's fields are names, `it` the record)."""
    assert ds.filter is not None
    env = Env(vars={}, params=ds.filter_params)
    kept = []
    for n, item in enumerate(items, 1):
        try:
            if evaluate(ds.filter, env.child_item(item)):
                kept.append(item)
        except EvalError as e:
            raise ValueError(f"data '{ds.name}', record {n}: its filter failed: {e}") from None
    if items and not kept:  # a game over it would play nothing, silently: a misspelt value, most likely
        span = getattr(ds.filter, "span", None)
        where = f" (at {span.file}:{span.line}:{span.col})" if span else ""
        given = ", ".join(f"{k} = {v!r}" for k, v in sorted(ds.filter_params.items()))
        raise ValueError(f"data '{ds.name}': its `where` filter{where} keeps none of its {len(items)} records"
                         + (f" (with {given})" if given else "")
                         + "; check the compared values against the data (askspec query, or the file itself)")
    return kept



class Plan:
    """The sessions of some games, in order, cut at `max_sessions` (keeping whole groups),
    generated lazily: a plan of 10**12 sessions costs nothing until it is iterated, and
    `--sessions` cuts it without building it. Iterable any number of times (a resumed run
    walks it once to find the finished sessions, then again to run the rest). `total` is
    counted arithmetically, without listing the sessions."""

    def __init__(self, games: list[ir.Game], params: dict[str, Any], collections: dict[str, list], seed: int,
                 max_sessions: int | None = None, start: int = 0) -> None:
        self.games = list(games)
        self.params = params
        self.collections = collections
        self.seed = seed
        self.max_sessions = max_sessions
        self.start = start
        self.total = cut_total([(self._count(g), g.group_size) for g in self.games], max_sessions)

    def _count(self, game: ir.Game) -> int:
        """The game's sessions; also checks that its items unpack into its pattern, so a
        bad data set is refused before the run rather than in the middle of it."""
        sizes = {name: len(items) for name, items in self.collections.items()}
        try:
            n = game_sessions(game, self.params, sizes)
        except Unknown:  # a shape the arithmetic does not know: evaluate the (small) list
            items = _items(game, self.params, self.collections)
            for item in items:
                bind(game, item)
            return len(items) * game.times * game.group_size
        for item in itertools.islice(_iter_items(game, self.params, self.collections), 1):
            bind(game, item)  # lazily made items share one shape: the first one tells
        return n

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[SessionPlan]:
        k = self.start
        end = self.start + self.total
        for game in self.games:
            for item_index, item in enumerate(_iter_items(game, self.params, self.collections)):
                bindings = bind(game, item)
                for rep in range(game.times):
                    group_id = f"{game.name}-g{item_index:05d}-r{rep:03d}" if game.group_size > 1 else None
                    for member in range(game.group_size):
                        if k >= end:
                            return
                        yield SessionPlan(index=k, session_id=f"s{k:06d}", game=game.name, group_id=group_id,
                                          group_size=game.group_size, bindings=bindings,
                                          seed=derive_seed(self.seed, game.name, item_index, rep, member),
                                          item_index=item_index)
                        k += 1


def _items(game: ir.Game, params: dict[str, Any], collections: dict[str, list]) -> list:
    assert game.iter is not None  # a game without `for` has one item (_iter_items; game_sessions counts it)
    items = evaluate(game.iter, Env(vars={}, params=params, collections=collections))
    if not isinstance(items, list):
        raise ValueError(f"game {game.name}: 'for' did not produce a list")
    return items


def _iter_items(game: ir.Game, params: dict[str, Any], collections: dict[str, list]) -> Iterable[Any]:
    """The items of a game's `for`, lazily where the shape allows (range, pairs, product),
    so that only the items a cut plan reaches are ever made."""
    it = game.iter
    if it is None:
        return [None]
    if isinstance(it, ir.CallFn) and not it.kwargs:
        env = Env(vars={}, params=params, collections=collections)
        if it.fn == "range" and 1 <= len(it.args) <= 2:
            return spec_range(*(evaluate(a, env) for a in it.args))
        if it.fn == "pairs" and len(it.args) == 1:
            return (list(pair) for pair in itertools.combinations(_lazy_list(it.args[0], env), 2))
        if it.fn == "product" and it.args:
            return (list(t) for t in itertools.product(*(_lazy_list(a, env) for a in it.args)))
    return _items(game, params, collections)


def _lazy_list(e: ir.Expr, env: Env) -> Any:
    if isinstance(e, ir.CallFn) and e.fn == "range" and 1 <= len(e.args) <= 2 and not e.kwargs:
        return spec_range(*(evaluate(a, env) for a in e.args))  # a sequence, never listed
    value = evaluate(e, env)
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    return value


def bind(game: ir.Game, item: Any) -> dict[str, Any]:
    """The names of `game`'s `for` pattern bound to one of its items."""
    if not game.pattern:
        return {}
    if len(game.pattern) == 1:
        return {game.pattern[0]: item}
    values = list(item) if isinstance(item, (list, tuple)) else []
    if len(values) != len(game.pattern):
        raise ValueError(f"game {game.name}: cannot unpack {item!r} into {', '.join(game.pattern)}")
    return dict(zip(game.pattern, values))


def game_elements(game: ir.Game, params: dict[str, Any], collections: dict[str, list]) -> list[dict[str, Any]]:
    """The game's elements in plan order, each as its pattern bindings (`for (a, b) in ...`
    -> {a:, b:}); a game without `for` has one element with no bindings."""
    return [bind(game, item) for item in _iter_items(game, params, collections)]


def plan_sessions(exp: ir.Experiment, params: dict[str, Any], datasets: dict[str, list], seed: int,
                  max_sessions: int | None = None) -> Plan:
    """The first phase: every game that does not replay a buffer."""
    return Plan(first_phase(exp), params, datasets, seed, max_sessions, start=0)


def plan_games(games: list[ir.Game], params: dict[str, Any], collections: dict[str, list], seed: int,
               max_sessions: int | None = None, start: int = 0) -> Plan:
    return Plan(games, params, collections, seed, max_sessions, start)
