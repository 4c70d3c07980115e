"""The session plan: which sessions a run consists of, derived from the IR alone.

Each game expands to (items of its `for`) × `times` × `sample` sessions. Session ids and
seeds depend only on the plan position and the run seed, so a resumed run re-creates
exactly the same sessions."""

from __future__ import annotations

import hashlib
import io
import json
import random
from dataclasses import dataclass
from typing import Any

from askspec.ir import model as ir
from askspec.lang.paths import MAX_DATA_BYTES, open_spec_file

from askspec.runtime.engine.evaluator import Env, evaluate


@dataclass(frozen=True)
class SessionPlan:
    index: int
    session_id: str
    game: str
    group_id: str | None
    group_size: int
    bindings: dict[str, Any]  # the game's `for` pattern names -> values
    seed: int


def derive_seed(*parts: Any) -> int:
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "big")


def load_dataset(ds: ir.Dataset, spec_dir: str, seed: int) -> list[Any]:
    if ds.format == "list":
        items = list(ds.items or [])
    else:
        # the checks `check` made (inside the spec's folder, a regular file, size cap),
        # made again on the file actually read: it may have changed since
        path = ds.path or ""
        with open_spec_file(spec_dir, path, MAX_DATA_BYTES) as raw:
            if ds.format in ("jsonl", "knowledge"):
                items = []
                for n, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8"), 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        items.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n}: invalid JSON line ({e.msg})") from None
            else:
                import pyarrow.parquet as pq

                items = pq.read_table(raw).to_pylist()
    if ds.options.get("shuffle"):
        random.Random(derive_seed(seed, ds.name, ds.options.get("seed", 0))).shuffle(items)
    limit = ds.options.get("limit")
    if isinstance(limit, (int, float)) and limit >= 0:
        items = items[: int(limit)]
    return items


def replays_buffer(game: ir.Game) -> str | None:
    """The buffer a game iterates over, if any: such a game is planned only once the
    games before it have filled the buffer (a later phase of the run)."""
    it = game.iter
    if it is not None and it.kind == "ref" and it.scope == "buffer":
        return it.name
    return None


def plan_sessions(exp: ir.Experiment, params: dict[str, Any], datasets: dict[str, list], seed: int,
                  max_sessions: int | None = None) -> list[SessionPlan]:
    """The first phase: every game that does not replay a buffer."""
    games = [g for g in exp.games if replays_buffer(g) is None]
    return plan_games(games, params, datasets, seed, max_sessions, start=0)


def plan_games(games: list[ir.Game], params: dict[str, Any], collections: dict[str, list], seed: int,
               max_sessions: int | None = None, start: int = 0) -> list[SessionPlan]:
    plans: list[SessionPlan] = []
    for game in games:
        if game.iter is not None:
            items = evaluate(game.iter, Env(vars={}, params=params, collections=collections))
            if not isinstance(items, list):
                raise ValueError(f"game {game.name}: 'for' did not produce a list")
        else:
            items = [None]
        for item_index, item in enumerate(items):
            if game.pattern:
                if len(game.pattern) == 1:
                    bindings = {game.pattern[0]: item}
                else:
                    values = list(item) if isinstance(item, (list, tuple)) else []
                    if len(values) != len(game.pattern):
                        raise ValueError(f"game {game.name}: cannot unpack {item!r} into {', '.join(game.pattern)}")
                    bindings = dict(zip(game.pattern, values))
            else:
                bindings = {}
            for rep in range(game.times):
                group_id = f"{game.name}-g{item_index:05d}-r{rep:03d}" if game.group_size > 1 else None
                for member in range(game.group_size):
                    k = start + len(plans)
                    plans.append(SessionPlan(index=k, session_id=f"s{k:06d}", game=game.name, group_id=group_id,
                                             group_size=game.group_size, bindings=bindings,
                                             seed=derive_seed(seed, game.name, item_index, rep, member)))
    if max_sessions is not None and max_sessions < len(plans):
        cut = max_sessions
        # keep whole groups: a group's route needs all of its members
        while cut < len(plans) and plans[cut].group_id is not None and plans[cut].group_id == plans[cut - 1].group_id:
            cut += 1
        plans = plans[:cut]
    return plans
