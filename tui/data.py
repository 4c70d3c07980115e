"""The TUI's one door to the run store.

Everything the app shows comes from here, and everything here reads through the store's
views (``askspec.runtime.store.views``): over the run's files (``Source``) or, for the run
being looked at, over its mirror (``RunMirror``: its session, reward and group events in
memory, read incrementally). The app calls these functions only from worker threads and
gets plain data or Arrow tables back. Nothing here imports Textual, so the queries are
tested (and benchmarked) without a UI.

Rewards are shown as the trainer uses them (``FINAL_REWARDS``): a session's per-turn
rewards of a role plus its terminal ones, where a group's ``tournament``/``judge`` route
for the role replaces the verifier's terminal rewards by the routed one.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from askspec.runtime.store import readonly
from askspec.runtime.store.describe import json_value
from askspec.terminal import printable
from askspec.tui import shaping, stats
from askspec.tui.filters import Filter, VarTest, escape_like, like_pattern
from askspec.tui.mirror import RunMirror
from askspec.tui.source import DataError, Source, check_path, fingerprint, one_line


@contextlib.contextmanager
def _reading(db: Source | RunMirror | duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of the store or a mirror for this thread; DuckDB's errors become one-line
    DataErrors (an interrupt is passed on, for ``Source.background`` to report)."""
    cur = db.cursor()
    try:
        yield cur
    except duckdb.InterruptException:
        raise
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    finally:
        try:
            cur.close()
        except duckdb.Error:  # still busy with a query run_readonly's watchdog gave up on
            pass


def _rows(cur: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[dict]:
    return cur.sql(sql, params=params or None).to_arrow_table().to_pylist()


def _one(cur: duckdb.DuckDBPyConnection, sql: str, params: list) -> tuple | None:
    rows = cur.execute(sql, params).fetchall()  # fetch all: a half-read result blocks the cursor
    return rows[0] if rows else None


# ------------------------------------------------------------------------- rewards

ROUTED = shaping.ROUTED_REWARDS  # reward names a group's route writes (runtime.engine.routing)

# Per (run, session, role): the reward the trainer uses (runtime/train/batch.py). Per-turn
# rewards always count; of the terminal ones, the routed reward when the session's group
# was routed to a tournament or judge for that role, else the others.
FINAL_REWARDS = f"""
    SELECT w.run_id, w.session_id, w.role, sum(w.value) AS total
    FROM rewards w
    JOIN sessions s USING (run_id, session_id)
    LEFT JOIN (SELECT run_id, group_id, stats->>'$.role' AS role FROM groups
               WHERE split_part(route, ':', 1) IN {ROUTED}) g
      ON g.run_id = s.run_id AND g.group_id = s.group_id AND g.role = w.role
    WHERE w.turn_index IS NOT NULL OR (w.name IN {ROUTED}) = (g.group_id IS NOT NULL)
    GROUP BY ALL
"""

# The final rewards of the sessions the trainer would use: finished ok, in a group the
# route neither dropped nor failed on for that role.
_USED_FINALS = f"""
    FROM ({FINAL_REWARDS}) f
    JOIN sessions s USING (run_id, session_id)
    LEFT JOIN groups g ON g.run_id = s.run_id AND g.group_id = s.group_id
    WHERE s.status = 'ok'
      AND NOT coalesce(g.route IN ('drop', 'error') AND coalesce(g.stats->>'$.role', f.role) = f.role, false)
"""
# Their mean per (run, role), and (for an interval) the values themselves
MEAN_REWARDS = f"SELECT f.run_id, f.role, avg(f.total) AS mean {_USED_FINALS} GROUP BY ALL ORDER BY f.role"
REWARD_VALUES = f"SELECT f.run_id, f.role, list(f.total) AS reward_values {_USED_FINALS} GROUP BY ALL ORDER BY f.role"

# ----------------------------------------------------------------------------- runs

@dataclass
class RunInfo:
    run_id: str
    run_dir: str
    experiment: str | None
    experiment_hash: str | None
    status: str | None
    planned: int | None
    started_at: Any
    ended_at: Any
    done: int = 0
    errors: int = 0
    running: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    mean_reward: dict[str, float] = field(default_factory=dict)
    roles: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    summarized: bool = False  # counts and rewards filled in (``summarize``)

    @property
    def live(self) -> bool:
        return self.status == "running"


def _run_rows(cur: duckdb.DuckDBPyConnection, run_id: str | None = None) -> list[RunInfo]:
    where = " WHERE run_id = ?" if run_id is not None else ""
    rows = _rows(cur, "SELECT run_id, run_dir, experiment, experiment_hash, status, planned_sessions, "
                      "started_at, ended_at, roles, params FROM runs" + where + " ORDER BY started_at, run_id",
                 [run_id] if run_id is not None else None)
    return [RunInfo(
        run_id=r["run_id"], run_dir=r["run_dir"], experiment=r["experiment"],
        experiment_hash=r["experiment_hash"], status=r["status"], planned=r["planned_sessions"],
        started_at=r["started_at"], ended_at=r["ended_at"], roles=json_value(r["roles"]) or {},
        params=json_value(r["params"]) or {}) for r in rows]


def _fill(infos: list[RunInfo], cur: duckdb.DuckDBPyConnection, rewards: bool = True) -> None:
    """Session counts by status and outcome, and (``rewards``) the mean final reward per
    role, of each run in ``infos``, from whatever views ``cur`` has."""
    by_id = {i.run_id: i for i in infos}
    counts = _rows(cur, "SELECT run_id, status, outcome, count(*) AS n FROM sessions GROUP BY ALL")
    for info in infos:
        info.done = info.errors = info.running = 0
        info.outcomes = {}
    for c in counts:
        run = by_id.get(c["run_id"])
        if run is None:
            continue
        if c["status"] == "running":
            run.running += c["n"]
            continue
        run.done += c["n"]
        if c["status"] == "error":
            run.errors += c["n"]
        else:
            key = c["outcome"] if c["outcome"] is not None else "ok"
            run.outcomes[key] = run.outcomes.get(key, 0) + c["n"]
    if rewards:
        for info in infos:
            info.mean_reward = {}
        for m in _rows(cur, MEAN_REWARDS):
            if m["run_id"] in by_id and m["mean"] is not None:
                by_id[m["run_id"]].mean_reward[m["role"]] = m["mean"]
    for info in infos:
        info.summarized = True


def list_runs(source: Source) -> list[RunInfo]:
    """Every run under the source, oldest first, from the manifests only (cheap: the
    runs screen shows them at once; ``summarize_runs`` adds counts and rewards)."""
    with _reading(source) as cur:
        return _run_rows(cur)


def summarize_runs(source: Source) -> list[RunInfo]:
    """``list_runs`` with session counts, outcome counts and mean final reward per role
    (scans every run's sessions and rewards: a second, slower step, which
    ``source.pause("summaries")`` stops)."""
    with source.background("summaries") as cur:
        return _summarized(cur)


def _summarized(cur: duckdb.DuckDBPyConnection) -> list[RunInfo]:
    try:
        infos = _run_rows(cur)
        _fill(infos, cur)
        return infos
    except duckdb.InterruptException:
        raise
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None


def run_info(source: Source, run_id: str) -> RunInfo:
    """One run with its counts, from its mirror (new events read first); mean rewards
    once the mirror holds the rewards."""
    with _reading(source) as cur:
        infos = _run_rows(cur, run_id)
    if not infos:
        raise DataError(f"no run {run_id} under {source.path}")
    mirror = source.mirror(run_id)
    mirror.refresh(("sessions", "groups") + (("rewards",) if "rewards" in mirror.loaded else ()))
    with _reading(mirror) as cur:
        _fill(infos, cur, rewards="rewards" in mirror.loaded)
    return infos[0]


# ------------------------------------------------------------------------- sessions

SESSION_COLUMNS = ("#", "session", "game", "group", "status", "outcome")


def _any_of(column: str, values: list[str], params: list[Any]) -> str:
    parts = []
    for v in values:
        if v.lower() in ("-", "none", "null"):
            parts.append(f"{column} IS NULL")
        else:
            parts.append(f"{column} LIKE ? ESCAPE '\\'")
            params.append(like_pattern(v))
    return "(" + " OR ".join(parts) + ")"


def _turn_matches(source: Source, run_id: str, f: Filter) -> pa.Table:
    """Session ids of the run where ``f.role`` took a turn and whose turn texts contain
    each of ``f.text`` (over the store's turns view: a scan of the run's turns)."""
    where, params = ["run_id = ?"], [run_id]
    if f.role:
        where.append("session_id IN (SELECT session_id FROM turns WHERE run_id = ? AND role = ?)")
        params += [run_id, f.role]
    for phrase in f.text:
        where.append("session_id IN (SELECT session_id FROM turns WHERE run_id = ? AND text ILIKE ? ESCAPE '\\')")
        params += [run_id, "%" + escape_like(phrase) + "%"]
    with _reading(source) as cur:
        return cur.sql("SELECT DISTINCT session_id FROM sessions WHERE " + " AND ".join(where),
                       params=params).to_arrow_table()


def _filter_sql(f: Filter) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if f.status:
        where.append(_any_of("s.status", f.status, params))
    if f.outcome:
        where.append(_any_of("s.outcome", f.outcome, params))
    if f.game:
        where.append(_any_of("s.game", f.game, params))
    if f.group:
        where.append(_any_of("s.group_id", f.group, params))
    if f.stage:
        where.append(_any_of("s.stage", f.stage, params))
    if f.needs_turns:
        where.append("s.session_id IN (SELECT session_id FROM _turn_matches)")
    if f.reward:
        total = "(SELECT sum(total) FROM fin WHERE fin.session_id = s.session_id" + (
            " AND fin.role = ?)" if f.role else ")")
        if f.role:
            params.append(f.role)
        _in_range(total, f.reward, where, params)
    if f.step:
        _in_range(STEP_SQL, f.step, where, params)
    for v in f.vars:
        where.append(_var_sql(v, params))
    return where, params


def _in_range(value_sql: str, bounds: tuple[float | None, float | None], where: list[str], params: list[Any]) -> None:
    lo, hi = bounds
    if lo is not None and hi is not None:
        where.append(f"{value_sql} BETWEEN ? AND ?")
        params += [lo, hi]
    elif lo is not None:
        where.append(f"{value_sql} >= ?")
        params.append(lo)
    elif hi is not None:
        where.append(f"{value_sql} <= ?")
        params.append(hi)


def _var_path(name: str) -> str:
    """The JSON path of session variable ``name`` (quoted: any name is one key)."""
    return '$."' + name.replace('"', '') + '"'


def _var_sql(v: VarTest, params: list[Any]) -> str:
    """One ``var:`` term as a condition on ``s.vars``."""
    text = "json_extract_string(s.vars, ?)"
    num = "TRY_CAST(json_extract_string(s.vars, ?) AS DOUBLE)"
    path = _var_path(v.name)
    if v.op in ("=", "!="):
        if v.value.lower() in ("-", "none", "null"):
            params.append(path)
            return f"{text} IS {'NOT ' if v.op == '!=' else ''}NULL"
        params += [path, like_pattern(v.value)]
        cond = f"{text} LIKE ? ESCAPE '\\'"
        if v.number is not None:  # 2 matches 2.0 in the JSON
            params += [path, v.number]
            cond = f"({cond} OR {num} = ?)"
        return f"coalesce({cond}, false)" if v.op == "=" else f"NOT coalesce({cond}, false)"
    params += [path, v.number]
    return f"{num} {v.op} ?"


CHEAP_REWARDS = 8 << 20  # bytes of rewards.ndjson read along with a run's first paint


def rewards_are_cheap(source: Source, run_id: str) -> bool:
    """Whether the run's rewards can come with its first paint: read already, or few."""
    mirror = source.mirror(run_id)
    src = mirror.sources.get("rewards")
    path = src.path if src is not None else None
    try:
        # (a Parquet copy is some 30 times smaller than its NDJSON for as many rows)
        return path is None or "rewards" in mirror.loaded or \
            path.stat().st_size <= (CHEAP_REWARDS if path.suffix == ".ndjson" else CHEAP_REWARDS // 32)
    except OSError:
        return True


def sessions_table(source: Source, run_id: str, flt: Filter | None = None, rewards: bool = True,
                   tokens: bool = False) -> pa.Table:
    """The sessions of a run in plan order: one row each, with (``rewards``) each role's
    final reward. Reads what was appended to the run's files since the last call.

    Without ``rewards`` only the run's sessions are read (the first paint of a large
    run); the reward columns come with the next call. Columns: #, session, game, group,
    status, outcome, step, stage, item (the bound data item: its ``id`` field, or the
    value), one per session variable (``vars``, less the engine's ``__`` keys and the
    names the item is bound to; a name taken by another column is ``var:NAME``), one per rewarded role, with
    ``tokens`` tokens in and out per role (``ROLE in``, ``ROLE out``: a scan of the
    turns), started, seconds, error; columns that are null in every row (a role never
    rewarded, no errors, no training step) are left out."""
    flt = flt or Filter()
    mirror = source.mirror(run_id)
    needs_rewards = rewards or flt.reward is not None
    matches = _turn_matches(source, run_id, flt) if flt.needs_turns else None
    token_table = session_tokens(source, run_id) if tokens else None
    mirror.refresh(("sessions", "groups") + (("rewards",) if needs_rewards else ()))
    version = mirror.version  # (before the query: a refresh meanwhile only costs a recomputation)
    key = ("sessions", repr(flt), needs_rewards)
    hit = mirror.memo.get(key)
    if matches is None and token_table is None and hit is not None and hit[0] == version:
        return hit[1]
    with _reading(mirror) as cur:
        roles = [r for (r,) in cur.execute("SELECT DISTINCT role FROM rewards WHERE run_id = ? ORDER BY role",
                                           [run_id]).fetchall()] if needs_rewards else []
        roles = _ordered_roles(source, run_id, roles)
        if matches is not None:
            cur.register("_turn_matches", matches)
        extra = _session_columns(cur, run_id, roles, _patterns(source, run_id))
        sql, params = _sessions_sql(run_id, flt, roles, needs_rewards, extra)
        table = cur.sql(sql, params=params).to_arrow_table()
    if token_table is not None:
        table = _join_tokens(table, token_table, roles)
    table = displayable(drop_null_columns(table, keep=SESSION_COLUMNS))
    if matches is None and token_table is None:
        if len(mirror.memo) > 8:
            mirror.memo.clear()
        mirror.memo[key] = (version, table)
    return table


# the training step a session was played for (the sessions view's; null when evaluating)
STEP_SQL = "s.step"
_NUMERIC_JSON = {"UBIGINT", "BIGINT", "DOUBLE"}


def _patterns(source: Source, run_id: str) -> dict[str, list[str]]:
    """Each game's ``for`` pattern (the names its data item is bound to), from the IR."""
    exp = shaping.load_ir(_run_dir(source, run_id))
    return {g.name: list(g.pattern) for g in exp.games if g.pattern} if exp is not None else {}


def _item_sql(patterns: dict[str, list[str]]) -> str:
    """The session's data item as text: a single bound value's ``id`` field, else the
    value itself; several bound names (``for (a, b) in ...``) joined by ", "."""
    arms = []
    for game, names in patterns.items():
        if len(names) == 1:
            p = _sql_text(_var_path(names[0]))
            expr = (f"coalesce(json_extract_string(s.params, {_sql_text(_var_path(names[0]) + '.id')}), "
                    f"json_extract_string(s.params, {p}))")
        else:
            expr = "concat_ws(', ', " + ", ".join(f"json_extract_string(s.params, {_sql_text(_var_path(n))})"
                                                  for n in names) + ")"
        arms.append(f"WHEN {_sql_text(game)} THEN {expr}")
    return f"CASE s.game {' '.join(arms)} END" if arms else "NULL::VARCHAR"


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _session_columns(cur: duckdb.DuckDBPyConnection, run_id: str, roles: list[str],
                     patterns: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(SQL expression, column name) of the columns after ``outcome``: step, stage, item
    and one per session variable, typed by the JSON values it holds (numbers sort as
    numbers, booleans as booleans, the rest as text)."""
    extra = [(STEP_SQL, "step"), ("s.stage", "stage"), (_item_sql(patterns), "item")]
    rows = cur.execute(
        "SELECT j.key, list(DISTINCT json_type(j.value)) FROM sessions s, json_each(s.vars) j "
        "WHERE s.run_id = ? AND NOT starts_with(j.key, '__') GROUP BY j.key ORDER BY j.key", [run_id]).fetchall()
    taken = set(SESSION_COLUMNS) | {"step", "stage", "item", "started", "seconds", "error"} | set(roles)
    bound = {n for names in patterns.values() for n in names}
    for name, types in rows:
        if name in bound:  # the data item (its id in ``item``; the transcript shows it whole)
            continue
        kinds = {t for t in types if t not in ("NULL", None)}
        text = f"json_extract_string(s.vars, {_sql_text(_var_path(name))})"
        if kinds and kinds <= _NUMERIC_JSON:
            expr = f"TRY_CAST({text} AS {'DOUBLE' if 'DOUBLE' in kinds else 'BIGINT'})"
        elif kinds == {"BOOLEAN"}:
            expr = f"TRY_CAST({text} AS BOOLEAN)"
        else:
            expr = text
        extra.append((expr, f"var:{name}" if name in taken else name))
    return extra


def session_tokens(source: Source, run_id: str) -> pa.Table:
    """Tokens in and out per (session, role) of a run's turns (a scan of its turns; kept
    while the turns file keeps its size)."""
    mirror = source.mirror(run_id)
    src = mirror.sources.get("turns")
    try:
        size = src.path.stat().st_size if src is not None else 0
    except OSError:
        size = 0
    hit = mirror.memo.get(("tokens",))
    if hit is not None and hit[0] == size:
        return hit[1]
    with _reading(source) as cur:
        table = cur.sql("SELECT session_id, role, sum(tokens_in) AS tokens_in, sum(tokens_out) AS tokens_out "
                        "FROM turns WHERE run_id = ? AND group_id IS NULL GROUP BY ALL",
                        params=[run_id]).to_arrow_table()
    mirror.memo[("tokens",)] = (size, table)
    return table


def token_column(role: str, direction: str) -> str:
    """The name of a role's token column: ``ROLE in`` or ``ROLE out``."""
    return f"{role} {direction}"


def _join_tokens(table: pa.Table, tokens: pa.Table, roles: list[str]) -> pa.Table:
    """``table`` with ``ROLE in`` / ``ROLE out`` columns before ``started`` (roles in the
    order of the reward columns, then the others)."""
    by: dict[str, dict[str, tuple[int | None, int | None]]] = {}
    for r in tokens.to_pylist():
        by.setdefault(r["role"], {})[r["session_id"]] = (r["tokens_in"], r["tokens_out"])
    order = [r for r in roles if r in by] + sorted(r for r in by if r not in roles)
    sessions = table.column("session").to_pylist()
    at = table.column_names.index("started") if "started" in table.column_names else table.num_columns
    for role in order:
        got = by[role]
        for j, suffix in enumerate(("in", "out")):
            col = pa.array([got.get(sid, (None, None))[j] for sid in sessions], type=pa.int64())
            table = table.add_column(at, token_column(role, suffix), col)
            at += 1
    return table


FIRST_PAGE = 200  # sessions shown before a large run's sessions file has been read
HEAD_BYTES = 1 << 19  # bytes of sessions.ndjson they are read from (~1,000 sessions' events)
HEAD_ROWS = 4096  # events of a compacted run's sessions.parquet, likewise


def first_sessions(source: Source, run_id: str, rows: int = FIRST_PAGE) -> pa.Table | None:
    """The first ``rows`` sessions of a large run in plan order, read from the head of
    its sessions file alone, for the table's first paint while ``sessions_table`` reads
    the whole file (the columns of ``sessions_table(rewards=False)``); None for a run
    small enough to read whole at once, or already read.

    A session whose end lies beyond the head shows as still running until the whole
    table replaces this one (a second or two later)."""
    mirror = source.mirror(run_id)
    src = mirror.sources.get("sessions")
    if src is None or "sessions" in mirror.loaded:
        return None
    try:
        # (a Parquet copy is some 30 times smaller than its NDJSON)
        if src.path.stat().st_size <= (HEAD_BYTES if src.path.suffix == ".ndjson" else HEAD_BYTES // 32):
            return None
    except OSError:
        return None
    try:
        con = mirror.head_store("sessions", HEAD_BYTES, HEAD_ROWS)
    except (OSError, duckdb.Error) as e:
        raise DataError(one_line(e)) from None
    try:
        with _reading(con) as cur:
            sql, params = _sessions_sql(run_id, Filter(), [], False)
            table = cur.sql(sql + f" LIMIT {int(rows)}", params=params).to_arrow_table()
    finally:
        con.close()
    return displayable(drop_null_columns(table, keep=SESSION_COLUMNS))


def _sessions_sql(run_id: str, flt: Filter, roles: list[str], rewards: bool,
                  extra: list[tuple[str, str]] | None = None) -> tuple[str, list[Any]]:
    """The sessions table's query over a mirror: one row per session, the ``extra``
    columns (SQL, name) after ``outcome``, a final-reward column per role in ``roles``
    (``rewards``), the filter's conditions."""
    if rewards:
        pivot = "".join(f", sum(total) FILTER (WHERE role = ?) AS {_ident(r)}" for r in roles)
        head = (f"WITH fin AS ({FINAL_REWARDS}), fin_pivot AS (SELECT session_id{pivot} FROM fin "
                "WHERE run_id = ? GROUP BY session_id) ")
        params: list[Any] = roles + [run_id]
    else:
        head = ("WITH fin AS (SELECT NULL::VARCHAR AS session_id, NULL::VARCHAR AS role, NULL::DOUBLE AS total "
                "WHERE false), fin_pivot AS (SELECT NULL::VARCHAR AS session_id WHERE false) ")
        params = []
    where, where_params = _filter_sql(flt)
    role_cols = "".join(f", fin_pivot.{_ident(r)}" for r in roles)
    sql = head + (
        "SELECT s.\"index\" AS \"#\", s.session_id AS session, s.game, s.group_id AS \"group\", s.status, "
        "s.outcome" + "".join(f", {expr} AS {_ident(name)}" for expr, name in extra or ())
        + role_cols + ", strftime(s.started_at, '%H:%M:%S') AS started, "
        "round(epoch(s.ended_at) - epoch(s.started_at), 2) AS seconds, s.error "
        "FROM sessions s LEFT JOIN fin_pivot USING (session_id) WHERE s.run_id = ? "
        + "".join(f" AND {w}" for w in where)
        + " ORDER BY s.\"index\", s.session_id"
    )
    return sql, params + [run_id] + where_params


def _ordered_roles(source: Source, run_id: str, rewarded: list[str]) -> list[str]:
    """The rewarded roles in the order the run declares its roles."""
    if not rewarded:
        return []
    with _reading(source) as cur:
        rows = cur.execute("SELECT roles FROM runs WHERE run_id = ?", [run_id]).fetchall()
    declared = json_value(rows[0][0]) if rows else None
    order = list(declared) if isinstance(declared, dict) else []
    return [r for r in order if r in rewarded] + [r for r in rewarded if r not in order]


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def drop_null_columns(table: pa.Table, keep: tuple[str, ...] = ()) -> pa.Table:
    if table.num_rows == 0:
        return table
    names = [n for n in table.column_names
             if n in keep or table.column(n).null_count < table.num_rows]
    return table.select(names)


# C0/C1 controls (and newlines: cells are one line) in RE2 syntax, as printable() escapes them
_CONTROL_RE2 = r"[\x00-\x1f\x7f-\x9f\x{202a}-\x{202e}\x{2066}-\x{2069}]"


def displayable(table: pa.Table) -> pa.Table:
    """String columns with control characters escaped (``printable``), for table cells.

    Checked column by column with a vectorised regex, so clean data costs one scan."""
    cols = []
    changed = False
    for name, col in zip(table.column_names, table.columns):
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            if pc.any(pc.match_substring_regex(col, _CONTROL_RE2)).as_py():
                col = pa.chunked_array([pa.array(
                    [None if v is None else printable(v, single_line=True) for v in col.to_pylist()],
                    type=col.type)])
                changed = True
        elif not _plain_type(col.type):
            # JSON (an extension type), lists, structs: shown as their JSON text
            col = pa.chunked_array([pa.array([None if v is None else _cell_text(v) for v in col.to_pylist()],
                                             type=pa.string())])
            changed = True
        cols.append(col)
    return pa.table(cols, names=table.column_names) if changed else table


def _plain_type(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_temporal(t)
            or pa.types.is_decimal(t) or pa.types.is_null(t))


def _cell_text(v: Any) -> str:
    if isinstance(v, (dict, list)):
        v = json.dumps(v, ensure_ascii=False, default=str)
    return printable(str(v), single_line=True)


def _run_dir(source: Source, run_id: str) -> str | None:
    with _reading(source) as cur:
        row = _one(cur, "SELECT run_dir FROM runs WHERE run_id = ?", [run_id])
    return row[0] if row else None


def warm_run(source: Source, run_id: str) -> None:
    """What opening a transcript needs, done ahead (in a worker, after the sessions
    table is up): the run's turns indexed by session (the first time, one pass over the
    turns file; a compacted run needs none) and its compiled IR loaded."""
    source.mirror(run_id).warm()
    shaping.load_ir(_run_dir(source, run_id))


# ----------------------------------------------------------------------- transcript

def transcript(source: Source, run_id: str, session_id: str) -> shaping.Transcript:
    """One session: its row, turns in order (with highlights, forwarding, recovery marks),
    per-turn and terminal rewards. Only this session's lines are read (``session_store``)."""
    mirror = source.mirror(run_id)
    mirror.refresh(("sessions", "rewards", "groups"))
    run_dir = _run_dir(source, run_id)
    try:
        with mirror.session_store(session_id) as mini:
            sess = _rows(mini, "SELECT session_id, game, group_id, status, outcome, error, started_at, ended_at, "
                               "params, vars, attempt, step, stage FROM sessions WHERE run_id = ? AND session_id = ?",
                         [run_id, session_id])
            turns = _rows(mini, "SELECT turn_index, role, model, prompt, text, parsed, finish_reason, tokens_in, "
                                "tokens_out, latency_ms, error, overflow FROM turns WHERE run_id = ? AND session_id = ? "
                                "ORDER BY turn_index", [run_id, session_id])
            rewards = _rows(mini, "SELECT role, turn_index, name, value, kind FROM rewards "
                                  "WHERE run_id = ? AND session_id = ? ORDER BY ts, role, name",
                            [run_id, session_id])
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    if not sess:
        raise DataError(f"no session {session_id} in run {run_id}")
    s = sess[0]
    for k in ("params", "vars"):
        s[k] = json_value(s[k])
    for t in turns:
        for k in ("prompt", "parsed", "overflow"):
            t[k] = json_value(t[k])
    return shaping.build_transcript(run_id, s, turns, rewards, shaping.role_retries(run_dir),
                                    _routed_roles(mirror, run_id, s["group_id"]))


def _routed_roles(mirror: RunMirror, run_id: str, group_id: str | None) -> set[str]:
    """The roles whose rewards the session's group's route replaced (tournament, judge)."""
    if group_id is None:
        return set()
    with _reading(mirror) as cur:
        rows = cur.execute(f"SELECT stats->>'$.role' FROM groups WHERE run_id = ? AND group_id = ? "
                           f"AND split_part(route, ':', 1) IN {ROUTED}", [run_id, group_id]).fetchall()
    return {r for (r,) in rows if r is not None}


# --------------------------------------------------------------------------- groups

def groups_table(source: Source, run_id: str) -> pa.Table:
    """The groups of a run, as the trainer saw them: the training step, the members'
    final rewards' count, mean and std, the route, the role it trains on (the route's,
    else a trained role), the number of tournament matches and of members."""
    mirror = source.mirror(run_id)
    mirror.refresh(("sessions", "rewards", "groups", "matches"))
    trained = _trained_roles(source, run_id)
    with _reading(mirror) as cur:
        table = cur.sql(
            f"WITH fin AS ({FINAL_REWARDS}), "
            "g AS (SELECT group_id, route, members, stats->>'$.role' AS role FROM groups WHERE run_id = ?), "
            # the members' final rewards per role: the route's role, else the trained roles
            "m AS (SELECT g.group_id, f.role, count(*) AS n, avg(f.total) AS mean, stddev_samp(f.total) AS std "
            "      FROM g, unnest(g.members) AS u(session_id) JOIN fin f ON f.session_id = u.session_id "
            "      AND f.run_id = ? WHERE f.role = g.role OR (g.role IS NULL AND (f.role IN (SELECT unnest(?)) "
            "      OR len(?) = 0)) GROUP BY ALL), "
            f"st AS (SELECT s.group_id, min({STEP_SQL}) AS step FROM sessions s WHERE s.run_id = ? "
            "       AND s.group_id IS NOT NULL GROUP BY ALL), "
            "mt AS (SELECT group_id, count(*) AS n FROM matches WHERE run_id = ? GROUP BY group_id) "
            # (the numbers first: a narrow pane cuts the text at the right, never a number)
            "SELECT g.group_id AS \"group\", st.step, coalesce(m.n, 0) AS n, m.mean, "
            "coalesce(m.std, 0) * (m.n > 1)::INT AS std, g.route, coalesce(g.role, m.role) AS role, "
            "coalesce(mt.n, 0) AS matches, len(g.members) AS members "
            "FROM g LEFT JOIN m USING (group_id) LEFT JOIN st USING (group_id) LEFT JOIN mt USING (group_id) "
            "ORDER BY st.step NULLS FIRST, g.group_id, role",
            params=[run_id, run_id, trained, trained, run_id, run_id]).to_arrow_table()
    table = pc_round(table, ("mean", "std"))
    return displayable(drop_null_columns(table, keep=("group", "route")))


def pc_round(table: pa.Table, names: tuple[str, ...], digits: int = 4) -> pa.Table:
    """``table`` with its float columns ``names`` rounded (a mean of rewards that cancel
    is 0, not 2.8e-17; a table sorts on what it shows)."""
    for name in names:
        if name in table.column_names:
            i = table.column_names.index(name)
            table = table.set_column(i, name, pc.round(table.column(name), digits))
    return table


def _trained_roles(source: Source, run_id: str) -> list[str]:
    """The run's trained roles, in the order it declares them (its manifest's roles)."""
    with _reading(source) as cur:
        rows = cur.execute("SELECT roles FROM runs WHERE run_id = ?", [run_id]).fetchall()
    declared = json_value(rows[0][0]) if rows else None
    if not isinstance(declared, dict):
        return []
    return [r for r, spec in declared.items() if isinstance(spec, dict) and spec.get("trained")]


def group_detail(source: Source, run_id: str, group_id: str) -> shaping.GroupDetail:
    mirror = source.mirror(run_id)
    mirror.refresh()
    with _reading(mirror) as cur:
        g = _rows(cur, "SELECT group_id, route, stats, members FROM groups WHERE run_id = ? AND group_id = ?",
                  [run_id, group_id])
        matches = _rows(cur, "SELECT a, b, first_shown, verdict, outcome, raw FROM matches "
                             "WHERE run_id = ? AND group_id = ? ORDER BY ts", [run_id, group_id])
        rewards = _rows(cur, "SELECT w.session_id, w.role, w.turn_index, w.name, w.value FROM rewards w "
                             "JOIN sessions s USING (run_id, session_id) "
                             "WHERE w.run_id = ? AND s.group_id = ? ORDER BY w.session_id, w.name",
                        [run_id, group_id])
    with _reading(source) as cur:
        run = _rows(cur, "SELECT run_dir, params FROM runs WHERE run_id = ?", [run_id])
    if not g:
        raise DataError(f"no group {group_id} in run {run_id}")
    row = g[0]
    row["stats"] = json_value(row["stats"]) or {}
    run_dir = run[0]["run_dir"] if run else None
    params = json_value(run[0]["params"]) if run else {}
    return shaping.build_group(row, matches, rewards, run_dir, params or {}, _trained_roles(source, run_id))


# -------------------------------------------------------------------------- metrics

def metrics(source: Source, run_id: str) -> shaping.Metrics:
    """The spec's declared metrics (by their ``by`` keys), pair heatmaps and the
    ``train_steps`` series of one run."""
    from askspec.runtime.engine.metrics import evaluate_metrics, session_scopes

    note = None
    rows: list[dict] = []
    intervals: dict[tuple[str, str], stats.Interval] = {}
    errors = 0
    with _reading(source) as cur:
        steps = _rows(cur, "SELECT role, step, metrics FROM train_steps WHERE run_id = ? ORDER BY role, step",
                      [run_id])
    exp = shaping.load_ir(_run_dir(source, run_id))
    if exp is None:
        note = "the run has no readable ir.json: declared metrics are not available"
    elif not exp.metrics:
        note = "the spec declares no metrics"
    else:
        mirror = source.mirror(run_id)
        mirror.refresh(("sessions", "rewards"))
        with _reading(mirror) as cur:
            scopes, errors = session_scopes(cur, run_id)
        try:
            rows = evaluate_metrics(exp, scopes)
            intervals = stats.metric_intervals(exp, scopes)
        except Exception as e:  # an evaluation error is data for the screen, not a crash
            note = f"metrics could not be evaluated: {one_line(e)}"
        else:
            if not scopes:
                n = len(exp.metrics)
                note = f"{n} declared metric{'s' if n != 1 else ''}: no session has finished ok yet"
    for s in steps:
        s["metrics"] = json_value(s["metrics"])
    return shaping.build_metrics(rows, errors, steps, note, intervals)


# ------------------------------------------------------------------------------ sql

SQL_TIMEOUT = 120.0  # seconds a console query may run (SQL can describe unbounded work)
SQL_CELL_CHARS = 4096  # characters of a text cell fetched (the table shows a line of it)


def run_sql(source: Source, sql: str, limit: int = 100_000) -> tuple[pa.Table, int]:
    """Run the console's SQL over the views, read-only and confined (``readonly``: only
    queries run; COPY, ATTACH, SET ... are refused before anything runs); the result (at
    most ``limit`` rows shown) and the full row count. Raises DataError with a one-line
    reason."""
    if not sql.strip():
        raise DataError("type a query, e.g. SELECT outcome, count(*) FROM sessions GROUP BY ALL")
    with _reading(source) as cur:
        try:
            # at most ``limit`` rows fetched, counted on to the end (memory stays bounded)
            result = readonly.run_readonly(cur, sql, timeout=SQL_TIMEOUT,
                                           limits=readonly.Limits(rows=limit, cell_chars=SQL_CELL_CHARS, count=True))
        except (readonly.QueryRefused, readonly.QueryTimeout, readonly.QueryTooLarge) as e:
            raise DataError(one_line(e)) from None
    table = result.table
    if not table.num_columns:
        return pa.table({"result": ["ok"]}), 1
    return displayable(table), result.rows if result.rows is not None else table.num_rows


# -------------------------------------------------------------------------- compare

def compare(source_a: Source, run_a: str, source_b: Source, run_b: str) -> shaping.Comparison:
    """Two runs side by side: their settings (what differs marked), sessions, outcome
    rates, mean reward per role and the declared metrics, each with n and a 95 %
    interval, the difference B - A and whether the intervals overlap; and their
    training curves, overlaid."""
    infos, settings, rewards = {}, {}, {}
    for src, rid in ((source_a, run_a), (source_b, run_b)):
        with _reading(src) as cur:
            found = [r for r in _summarized(cur) if r.run_id == rid]
            if not found:
                raise DataError(f"no run {rid}")
            infos[rid] = found[0]
            settings[rid] = _rows(cur, "SELECT experiment, experiment_hash, seed, roles, params, overrides, run_options, "
                                       "versions FROM runs WHERE run_id = ?", [rid])[0]
            rewards[rid] = {r["role"]: r["reward_values"] for r in _rows(cur, REWARD_VALUES) if r["run_id"] == rid}
    for rid in settings:
        for k in ("roles", "params", "overrides", "run_options", "versions"):
            settings[rid][k] = json_value(settings[rid][k])
    ma, mb = metrics(source_a, run_a), metrics(source_b, run_b)
    return shaping.compare_runs(infos[run_a], infos[run_b], settings[run_a], settings[run_b], ma, mb,
                                rewards[run_a], rewards[run_b])


__all__ = [
    "DataError", "Source", "RunInfo", "check_path", "fingerprint", "list_runs", "summarize_runs", "run_info",
    "sessions_table", "first_sessions", "rewards_are_cheap", "warm_run", "transcript", "groups_table", "group_detail", "metrics",
    "run_sql", "compare", "displayable", "FINAL_REWARDS", "MEAN_REWARDS", "REWARD_VALUES",
]
