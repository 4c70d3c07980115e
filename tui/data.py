"""The TUI's one door to the run store.

Everything the app shows comes from here, and everything here reads through the store's
views (``askspec.runtime.store.views``); the app calls these functions only from worker
threads and gets plain data or Arrow tables back. Nothing here imports Textual, so the
queries are tested (and benchmarked) without a UI.

``Source`` holds one in-memory DuckDB connection over a folder of runs or one run dir;
each call takes its own cursor (DuckDB connections are not shared across threads) and
the store is reopened when the set of runs or their Parquet copies changes (the views
fix the file set when opened; contents are read live).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from askspec.runtime.store import layout, views
from askspec.terminal import printable
from askspec.tui import shaping
from askspec.tui.filters import Filter, escape_like, like_pattern

# The one place that opens a store. (A read-only, confined connection for the SQL
# console replaces this call when the store offers one.)
_connect = views.connect


class DataError(Exception):
    """Something the user should read (one line), not a crash."""


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return printable(first, single_line=True)


def check_path(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be opened (a one-line message), or None if it can.

    A folder without runs is not an error: the runs screen says so itself."""
    p = Path(path)
    if not p.exists():
        return f"no such directory: {p}"
    if not p.is_dir():
        return f"not a directory: {p} (give a run directory or a folder of runs)"
    return None


class Source:
    """A reopenable store over a folder of runs or a single run directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._store: views.Store | None = None
        self._key: tuple | None = None
        self.warnings: list[str] = []

    def run_dirs(self) -> list[Path]:
        return layout.find_run_dirs(self.path)

    def _listing_key(self) -> tuple:
        dirs = self.run_dirs()
        compacted = []
        for d in dirs:
            idx = layout.events_dir(d) / layout.COMPACTION_INDEX
            try:
                compacted.append(idx.stat().st_mtime_ns)
            except OSError:
                compacted.append(None)
        return tuple(str(d) for d in dirs), tuple(compacted)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of its own for the calling thread; reopens the store if runs changed.

        Raises DataError when there is nothing to open."""
        problem = check_path(self.path)
        if problem:
            raise DataError(problem)
        with self._lock:
            key = self._listing_key()
            if self._store is None or key != self._key:
                if not key[0]:
                    raise DataError(f"no runs in {self.path}")
                try:
                    self._store = _connect(self.path)
                except views.StoreError as e:
                    raise DataError(one_line(e)) from None
                self._key = key
                self.warnings = [printable(m, single_line=True) for _, m in self._store.warnings]
            return self._store.con.cursor()


def fingerprint(path: str | os.PathLike[str]) -> tuple:
    """Cheap change detector for follow mode: the runs under ``path`` and the sizes and
    modification times of their manifests and event files (a few stat calls per run)."""
    out = []
    for d in layout.find_run_dirs(path):
        files = [layout.manifest_path(d)] + sorted(layout.events_dir(d).glob("*.ndjson"))
        for f in files:
            try:
                st = f.stat()
                out.append((str(f), st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((str(f), None, None))
    return tuple(out)


def _rows(cur: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[dict]:
    return cur.sql(sql, params=params or None).to_arrow_table().to_pylist()


def _one(cur: duckdb.DuckDBPyConnection, sql: str, params: list) -> tuple | None:
    rows = cur.execute(sql, params).fetchall()  # fetch all: a half-read result blocks the cursor
    return rows[0] if rows else None


def _json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


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

    @property
    def live(self) -> bool:
        return self.status == "running"


def list_runs(source: Source) -> list[RunInfo]:
    """Every run under the source, oldest first, with session and reward summaries."""
    cur = source.cursor()
    try:
        runs = _rows(cur, "SELECT run_id, run_dir, experiment, experiment_hash, status, planned_sessions, "
                          "started_at, ended_at, roles, params FROM runs ORDER BY started_at, run_id")
        counts = _rows(cur, "SELECT run_id, status, outcome, count(*) AS n FROM sessions GROUP BY ALL")
        means = _rows(cur, "SELECT run_id, role, avg(total) AS mean FROM (SELECT run_id, session_id, role, "
                           "sum(value) AS total FROM rewards GROUP BY ALL) GROUP BY ALL ORDER BY role")
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    finally:
        cur.close()
    out = {r["run_id"]: RunInfo(
        run_id=r["run_id"], run_dir=r["run_dir"], experiment=r["experiment"],
        experiment_hash=r["experiment_hash"], status=r["status"], planned=r["planned_sessions"],
        started_at=r["started_at"], ended_at=r["ended_at"], roles=_json(r["roles"]) or {},
        params=_json(r["params"]) or {}) for r in runs}
    for c in counts:
        info = out.get(c["run_id"])
        if info is None:
            continue
        if c["status"] == "running":
            info.running += c["n"]
            continue
        info.done += c["n"]
        if c["status"] == "error":
            info.errors += c["n"]
        else:
            key = c["outcome"] if c["outcome"] is not None else "ok"
            info.outcomes[key] = info.outcomes.get(key, 0) + c["n"]
    for m in means:
        if m["run_id"] in out and m["mean"] is not None:
            out[m["run_id"]].mean_reward[m["role"]] = m["mean"]
    return list(out.values())


# ------------------------------------------------------------------------- sessions

SESSION_COLUMNS = ("#", "session", "game", "group", "status", "outcome")


def _role_columns(cur: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    rows = cur.execute("SELECT roles FROM runs WHERE run_id = ?", [run_id]).fetchall()
    roles = _json(rows[0][0]) if rows else None
    return list(roles) if isinstance(roles, dict) else []


def _filter_sql(f: Filter) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []

    def any_of(column: str, values: list[str]) -> None:
        parts = []
        for v in values:
            if v.lower() in ("-", "none", "null"):
                parts.append(f"{column} IS NULL")
            else:
                parts.append(f"{column} LIKE ? ESCAPE '\\'")
                params.append(like_pattern(v))
        where.append("(" + " OR ".join(parts) + ")")

    if f.status:
        any_of("s.status", f.status)
    if f.outcome:
        any_of("s.outcome", f.outcome)
    if f.game:
        any_of("s.game", f.game)
    if f.group:
        any_of("s.group_id", f.group)
    if f.role:
        where.append("s.session_id IN (SELECT session_id FROM turns WHERE run_id = s.run_id AND role = ?)")
        params.append(f.role)
    if f.reward:
        lo, hi = f.reward
        total = ("(SELECT sum(value) FROM rewards w WHERE w.run_id = s.run_id AND w.session_id = s.session_id"
                 + (" AND w.role = ?" if f.role else "") + ")")
        if f.role:
            params.append(f.role)
        if lo is not None and hi is not None:
            where.append(f"{total} BETWEEN ? AND ?")
            params += [lo, hi]
        elif lo is not None:
            where.append(f"{total} >= ?")
            params.append(lo)
        elif hi is not None:
            where.append(f"{total} <= ?")
            params.append(hi)
    for phrase in f.text:
        where.append("s.session_id IN (SELECT session_id FROM turns WHERE run_id = s.run_id "
                     "AND text ILIKE ? ESCAPE '\\')")
        params.append("%" + escape_like(phrase) + "%")
    return where, params


def sessions_table(source: Source, run_id: str, flt: Filter | None = None) -> pa.Table:
    """The sessions of a run in plan order: one row each, with each role's total reward.

    Columns: #, session, game, group, status, outcome, one per rewarded role, started,
    seconds, error. Columns that are null in every row (a role never rewarded, no
    errors) are left out."""
    flt = flt or Filter()
    cur = source.cursor()
    try:
        roles = _role_columns(cur, run_id)
        where, params = _filter_sql(flt)
        pivot = ", ".join(f"sum(value) FILTER (WHERE role = ?) AS {_ident(r)}" for r in roles)
        role_cols = ", ".join(f"rw.{_ident(r)}" for r in roles)
        sql = (
            "WITH rw AS (SELECT session_id" + (", " + pivot if pivot else "")
            + " FROM rewards WHERE run_id = ? GROUP BY session_id) "
            "SELECT s.\"index\" AS \"#\", s.session_id AS session, s.game, s.group_id AS \"group\", s.status, "
            "s.outcome" + (", " + role_cols if role_cols else "")
            + ", strftime(s.started_at, '%H:%M:%S') AS started, "
            "round(epoch(s.ended_at) - epoch(s.started_at), 2) AS seconds, s.error "
            "FROM sessions s LEFT JOIN rw USING (session_id) WHERE s.run_id = ? "
            + "".join(f" AND {w}" for w in where)
            + " ORDER BY s.\"index\", s.session_id"
        )
        table = cur.sql(sql, params=roles + [run_id, run_id] + params).to_arrow_table()
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    finally:
        cur.close()
    return displayable(drop_null_columns(table, keep=SESSION_COLUMNS))


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


def session_count(source: Source, run_id: str) -> int:
    cur = source.cursor()
    try:
        return _one(cur, "SELECT count(*) FROM sessions WHERE run_id = ?", [run_id])[0]
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    finally:
        cur.close()


# ----------------------------------------------------------------------- transcript

def transcript(source: Source, run_id: str, session_id: str) -> shaping.Transcript:
    """One session: its row, turns in order (with highlights, forwarding, recovery marks),
    per-turn and terminal rewards."""
    cur = source.cursor()
    try:
        sess = _rows(cur, "SELECT session_id, game, group_id, status, outcome, error, started_at, ended_at, "
                          "params, vars, attempt FROM sessions WHERE run_id = ? AND session_id = ?",
                     [run_id, session_id])
        turns = _rows(cur, "SELECT turn_index, role, model, prompt, text, parsed, finish_reason, tokens_in, "
                           "tokens_out, latency_ms, error FROM turns WHERE run_id = ? AND session_id = ? "
                           "ORDER BY turn_index", [run_id, session_id])
        rewards = _rows(cur, "SELECT role, turn_index, name, value, kind FROM rewards "
                             "WHERE run_id = ? AND session_id = ? ORDER BY ts, role, name",
                        [run_id, session_id])
        run_dir = _one(cur, "SELECT run_dir FROM runs WHERE run_id = ?", [run_id])
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    finally:
        cur.close()
    if not sess:
        raise DataError(f"no session {session_id} in run {run_id}")
    s = sess[0]
    for k in ("params", "vars"):
        s[k] = _json(s[k])
    for t in turns:
        t["prompt"] = _json(t["prompt"])
        t["parsed"] = _json(t["parsed"])
    retries = shaping.role_retries(run_dir[0]) if run_dir else {}
    return shaping.build_transcript(run_id, s, turns, rewards, retries)


# --------------------------------------------------------------------------- groups

def groups_table(source: Source, run_id: str) -> pa.Table:
    """The groups of a run: route, member count, the routed role's reward statistics and
    the number of tournament matches."""
    cur = source.cursor()
    try:
        table = cur.sql(
            "SELECT g.group_id AS \"group\", g.route, len(g.members) AS members, "
            "g.stats->>'$.role' AS role, TRY_CAST(g.stats->>'$.mean' AS DOUBLE) AS mean, "
            "TRY_CAST(g.stats->>'$.var' AS DOUBLE) AS var, coalesce(m.n, 0) AS matches "
            "FROM groups g LEFT JOIN (SELECT group_id, count(*) AS n FROM matches WHERE run_id = ? "
            "GROUP BY group_id) m USING (group_id) WHERE g.run_id = ? ORDER BY g.group_id",
            params=[run_id, run_id]).to_arrow_table()
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    finally:
        cur.close()
    return displayable(table)


def group_detail(source: Source, run_id: str, group_id: str) -> shaping.GroupDetail:
    cur = source.cursor()
    try:
        g = _rows(cur, "SELECT group_id, route, stats, members FROM groups WHERE run_id = ? AND group_id = ?",
                  [run_id, group_id])
        matches = _rows(cur, "SELECT a, b, first_shown, verdict, outcome, raw FROM matches "
                             "WHERE run_id = ? AND group_id = ? ORDER BY ts", [run_id, group_id])
        rewards = _rows(cur, "SELECT w.session_id, w.role, w.name, w.value FROM rewards w "
                             "JOIN sessions s USING (run_id, session_id) "
                             "WHERE w.run_id = ? AND s.group_id = ? ORDER BY w.session_id, w.name",
                        [run_id, group_id])
        run = _rows(cur, "SELECT run_dir, params FROM runs WHERE run_id = ?", [run_id])
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    finally:
        cur.close()
    if not g:
        raise DataError(f"no group {group_id} in run {run_id}")
    row = g[0]
    row["stats"] = _json(row["stats"]) or {}
    run_dir = run[0]["run_dir"] if run else None
    params = _json(run[0]["params"]) if run else {}
    return shaping.build_group(row, matches, rewards, run_dir, params or {})


# -------------------------------------------------------------------------- metrics

def metrics(source: Source, run_id: str) -> shaping.Metrics:
    """The spec's declared metrics (by their ``by`` keys), pair heatmaps and the
    ``train_steps`` series of one run."""
    from askspec.runtime.engine.metrics import evaluate_metrics, session_scopes

    cur = source.cursor()
    note = None
    rows: list[dict] = []
    errors = 0
    try:
        run_dir = _one(cur, "SELECT run_dir FROM runs WHERE run_id = ?", [run_id])
        steps = _rows(cur, "SELECT role, step, metrics FROM train_steps WHERE run_id = ? ORDER BY role, step",
                      [run_id])
        exp = shaping.load_ir(run_dir[0]) if run_dir else None
        if exp is None:
            note = "the run has no readable ir.json: declared metrics are not available"
        elif not exp.metrics:
            note = "the spec declares no metrics"
        else:
            scopes, errors = session_scopes(cur, run_id)
            rows = evaluate_metrics(exp, scopes)
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    except Exception as e:  # an evaluation error is data for the screen, not a crash
        note = f"metrics could not be evaluated: {one_line(e)}"
    finally:
        cur.close()
    for s in steps:
        s["metrics"] = _json(s["metrics"])
    return shaping.build_metrics(rows, errors, steps, note)


# ------------------------------------------------------------------------------ sql

def run_sql(source: Source, sql: str, limit: int = 100_000) -> tuple[pa.Table, int]:
    """Run the console's SQL over the views; the result (at most ``limit`` rows shown)
    and the full row count. Raises DataError with DuckDB's one-line message."""
    if not sql.strip():
        raise DataError("type a query, e.g. SELECT outcome, count(*) FROM sessions GROUP BY ALL")
    cur = source.cursor()
    try:
        rel = cur.sql(sql)
        if rel is None:  # a statement without a result
            return pa.table({"result": ["ok"]}), 1
        table = rel.to_arrow_table()
    except duckdb.Error as e:
        raise DataError(one_line(e)) from None
    finally:
        cur.close()
    n = table.num_rows
    return displayable(table.slice(0, limit)), n


# -------------------------------------------------------------------------- compare

def compare(source_a: Source, run_a: str, source_b: Source, run_b: str) -> pa.Table:
    """Two runs side by side: sessions, outcome rates, mean reward per role and the
    declared metrics, with the difference B - A where both are numbers."""
    infos = {}
    for src, rid in ((source_a, run_a), (source_b, run_b)):
        found = [r for r in list_runs(src) if r.run_id == rid]
        if not found:
            raise DataError(f"no run {rid}")
        infos[rid] = found[0]
    ma, mb = metrics(source_a, run_a), metrics(source_b, run_b)
    return shaping.compare_table(infos[run_a], infos[run_b], ma, mb)


__all__ = [
    "DataError", "Source", "RunInfo", "check_path", "fingerprint", "list_runs", "sessions_table",
    "session_count", "transcript", "groups_table", "group_detail", "metrics", "run_sql", "compare",
    "displayable",
]
