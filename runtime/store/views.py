"""DuckDB views over one run directory or a folder of run directories.

Readers never open a ``.duckdb`` file: ``open_store`` creates an in-memory
connection whose views read the run's NDJSON event files (or their Parquet
copies once compacted) on every query, so they see new events while a writer
keeps appending, and nothing is locked.

Partial lines. A writer only appends whole lines, but a crash can leave a torn
last line, and a live writer may be mid-append while we scan. A proper prefix
of a JSON object is never valid JSON, so such a line is always a parse error:
``read_json(..., ignore_errors=true)`` turns it into an all-NULL row, which the
views drop with ``WHERE seq IS NOT NULL``. Nothing is copied and no line is
scanned twice, so this costs nothing on the hot path. The warning is computed
separately and cheaply: one small read at the end of each file (does it end in
``\\n``?), plus the manifest's record of torn lines that a resume terminated.

Views (all carry ``run_id``; JSON-valued columns have DuckDB's JSON type):

    runs(run_id, experiment, experiment_hash, status, started_at, ended_at, seed,
         planned_sessions, resumes, roles, params, versions, run_dir)
    sessions(run_id, session_id, game, group_id, status, outcome, error,
             started_at, ended_at, params, vars, attempt, index, bookkeeping)
    turns(run_id, session_id, turn_index, role, model, prompt, text, parsed,
          finish_reason, tokens_in, tokens_out, latency_ms, error, attempt, ts, group_id)
    rewards(run_id, session_id, role, turn_index, name, value, kind, attempt, ts)
    groups(run_id, group_id, route, stats, members, ts, judge_calls, unparsed)
    matches(run_id, group_id, a, b, first_shown, verdict, outcome, raw, ts)
    train_steps(run_id, role, step, metrics, ts)

Resume semantics: sessions/turns/rewards keep only each session's latest
attempt; a reward rewritten by a later writer generation supersedes the
earlier line; groups and train steps keep the last event per key; matches keep,
per group, only the writer generation that last wrote matches for it, and the
judge turns of a group's route (``group_id`` set, ``session_id`` = the group id)
only those of the generation that recorded the group's route. The raw
event streams stay reachable as ``events_<name>`` (``retried_sessions`` and
``rewarded_again`` are helpers of the views above).

Timestamps are UTC, typed TIMESTAMP (no time zone: TIMESTAMPTZ would need pytz
to reach Python). The set of runs and of files is fixed when the store is
opened; contents are read live. A long-lived reader (the TUI) reopens to pick
up new runs or a finished compaction; opening takes a few tens of ms.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from askspec.runtime.store import layout

# Public views, in the order ``export`` writes them.
VIEW_NAMES = ("runs", "sessions", "turns", "rewards", "groups", "matches", "train_steps")


class StoreError(Exception):
    """The path is not a run directory or a folder of runs."""


class PartialLineWarning(UserWarning):
    """An event file has a torn line from an interrupted write; it is ignored."""


class StaleParquetWarning(UserWarning):
    """A Parquet copy no longer matches its NDJSON file; the NDJSON is read instead."""


@dataclass
class Store:
    """An open store: the connection, the run dirs it spans, and what to warn about.

    ``files`` are the files its views read (manifests, NDJSON event files, Parquet
    copies): all a confined connection needs access to (see ``readonly``)."""

    con: duckdb.DuckDBPyConnection
    run_dirs: list[Path]
    warnings: list[tuple[type[Warning], str]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def _sql_str(s: str | os.PathLike[str]) -> str:
    return "'" + os.fspath(s).replace("'", "''") + "'"


def _sql_list(paths: list[Path]) -> str:
    return "[" + ", ".join(_sql_str(p) for p in paths) + "]"


def _columns_struct(cols: dict[str, str]) -> str:
    return "{" + ", ".join(f"{_sql_str(k)}: {_sql_str(v)}" for k, v in cols.items()) + "}"


def _select_list(cols: dict[str, str]) -> str:
    return ", ".join(f'"{c}"' for c in cols)


def _tail_state(path: Path) -> int:
    """Bytes after the last newline of ``path`` (0 when it ends cleanly or is empty)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return 0
            # Torn line: find where it starts (bounded search, lines are small).
            chunk = min(size, 1 << 20)
            f.seek(size - chunk)
            data = f.read(chunk)
            nl = data.rfind(b"\n")
            return chunk - nl - 1 if nl >= 0 else chunk  # (at least) the whole chunk
    except OSError:
        return 0


def _partial_tail(path: Path, live: bool) -> int:
    torn = _tail_state(path)
    if torn and live:
        # A live writer may be between the start and the end of one append;
        # look again before calling it a torn line.
        time.sleep(0.05)
        torn = _tail_state(path)
    return torn


def _parquet_is_current(run_dir: Path, name: str) -> bool | None:
    """Whether the Parquet copy of ``name`` can stand in for its NDJSON.

    None: no usable copy (absent, or compaction not finished: the index is
    written last). False: the NDJSON grew since compaction (stale copy).
    """
    pq = layout.parquet_path(run_dir, name)
    if not pq.exists():
        return None
    try:
        index = json.loads((layout.events_dir(run_dir) / layout.COMPACTION_INDEX).read_text())
        built_from = int(index["files"][name]["ndjson_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    nd = layout.ndjson_path(run_dir, name)
    if not nd.exists():  # NDJSON archived elsewhere: the copy is all there is
        return True
    return nd.stat().st_size == built_from


def raw_events_sql(name: str, ndjson: list[Path], parquet: list[Path]) -> str:
    """SQL for all raw events of file kind ``name`` across runs, typed per layout."""
    cols = layout.columns(name)
    sel = _select_list(cols)
    parts = []
    if ndjson:
        parts.append(
            f"SELECT {sel} FROM read_json({_sql_list(ndjson)}, format='newline_delimited', "
            f"columns={_columns_struct(cols)}, auto_detect=false, ignore_errors=true) "
            # ignore_errors yields an all-NULL row for a torn/invalid line; drop it.
            f"WHERE seq IS NOT NULL"
        )
    if parquet:
        parts.append(f"SELECT {sel} FROM read_parquet({_sql_list(parquet)})")
    if not parts:
        typed = ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in cols.items())
        parts.append(f"SELECT {typed} WHERE false")
    return "\nUNION ALL\n".join(parts)


# Views over the raw streams. ``retried_sessions`` lists only sessions with an
# attempt > 1 (none in a run that was never resumed), so the latest-attempt
# filters are ANTI JOINs against a tiny or empty build side: measured ~10x
# cheaper than a SEMI JOIN against every session's latest attempt.
_VIEW_SQL = {
    "retried_sessions": """
        SELECT run_id, session_id, max(attempt) AS attempt
        FROM events_sessions WHERE attempt > 1 GROUP BY run_id, session_id
    """,
    # One started and at most one finished line per (session, attempt).
    "sessions": """
        SELECT s.run_id, s.session_id, s.game, s.group_id,
               coalesce(f.status, 'running') AS status, f.outcome, f.error,
               s.ts AS started_at, f.ts AS ended_at, s.params, f.vars, s.attempt, s."index", f.bookkeeping
        FROM (SELECT e.* FROM events_sessions e
              ANTI JOIN retried_sessions r
                ON r.run_id = e.run_id AND r.session_id = e.session_id AND r.attempt <> e.attempt
              WHERE e.event = 'started') s
        LEFT JOIN (SELECT * FROM events_sessions WHERE event = 'finished') f
          USING (run_id, session_id, attempt)
    """,
    # A group routed by a resumed writer (its route was not recorded before the crash)
    # supersedes the judge turns an earlier generation wrote for it. Read from the small
    # groups file, and empty for a run that was never resumed, like retried_sessions.
    "rerouted_groups": """
        SELECT run_id, group_id, max(gen) AS gen FROM events_groups WHERE gen > 0 GROUP BY run_id, group_id
    """,
    "turns": """
        SELECT t.run_id, t.session_id, t.turn_index, t.role, t.model, t.prompt, t.text, t.parsed,
               t.finish_reason, t.tokens_in, t.tokens_out, t.latency_ms, t.error, t.attempt, t.ts, t.group_id
        FROM events_turns t
        ANTI JOIN retried_sessions r
          ON r.run_id = t.run_id AND r.session_id = t.session_id AND r.attempt <> t.attempt
        ANTI JOIN rerouted_groups g
          ON g.run_id = t.run_id AND g.group_id = t.group_id AND g.gen <> t.gen
    """,
    # Within one writer generation each reward is written once. A later
    # generation may write the same (session, attempt, role, turn, name) again
    # (e.g. a group's rewards recomputed after a crash); per key, only the lines
    # of the latest generation that wrote it count. (A LEFT JOIN, because the
    # planner turned the equivalent ANTI JOIN around and hashed every reward.)
    "rewarded_again": """
        SELECT run_id, session_id, attempt, role, turn_index, name, max(gen) AS gen
        FROM events_rewards WHERE gen > 0 GROUP BY ALL
    """,
    "rewards": """
        SELECT w.run_id, w.session_id, w.role, w.turn_index, w.name, w.value, w.kind, w.attempt, w.ts
        FROM events_rewards w
        ANTI JOIN retried_sessions r
          ON r.run_id = w.run_id AND r.session_id = w.session_id AND r.attempt <> w.attempt
        LEFT JOIN rewarded_again a
          ON a.run_id = w.run_id AND a.session_id = w.session_id AND a.attempt = w.attempt
         AND a.role = w.role AND a.turn_index IS NOT DISTINCT FROM w.turn_index AND a.name = w.name
        WHERE a.gen IS NULL OR a.gen = w.gen
    """,
    "groups": """
        SELECT run_id, group_id, route, stats, members, ts, judge_calls, unparsed FROM events_groups
        QUALIFY row_number() OVER (PARTITION BY run_id, group_id ORDER BY seq DESC) = 1
    """,
    "matches": """
        SELECT run_id, group_id, a, b, first_shown, verdict, outcome, raw, ts FROM events_matches
        QUALIFY gen = max(gen) OVER (PARTITION BY run_id, group_id)
    """,
    "train_steps": """
        SELECT run_id, role, step, metrics, ts FROM events_train_steps
        QUALIFY row_number() OVER (PARTITION BY run_id, role, step ORDER BY seq DESC) = 1
    """,
}


def connect(path: str | os.PathLike[str]) -> Store:
    """Open ``path`` (a run dir or a folder of run dirs) and define the views.

    Raises StoreError if ``path`` holds no run. Warnings are collected in
    ``Store.warnings`` rather than emitted, so callers choose how to show them.
    """
    root = Path(path)
    if not root.exists():
        raise StoreError(f"no such directory: {root}")
    if not root.is_dir():
        raise StoreError(f"not a directory: {root}")
    found: list[tuple[type[Warning], str]] = []
    runs: list[tuple[Path, dict]] = []
    for rd in layout.find_run_dirs(root):
        try:
            manifest = layout.read_manifest(rd)
        except (OSError, ValueError) as e:
            found.append((UserWarning, f"{rd.name}: unreadable manifest.json ({e}); run skipped"))
            continue
        runs.append((rd.resolve(), manifest))
    if not runs:
        raise StoreError(f"not a run directory or a folder of runs: {root}")

    con = duckdb.connect(":memory:")
    ndjson: dict[str, list[Path]] = {n: [] for n in layout.EVENT_NAMES}
    parquet: dict[str, list[Path]] = {n: [] for n in layout.EVENT_NAMES}
    for rd, manifest in runs:
        run_id = manifest.get("run_id", rd.name)
        live = manifest.get("status") == "running"
        for name in layout.EVENT_NAMES:
            nd = layout.ndjson_path(rd, name)
            current = _parquet_is_current(rd, name)
            if current:
                parquet[name].append(layout.parquet_path(rd, name))
            elif nd.exists():
                if current is False:
                    found.append((StaleParquetWarning,
                                  f"{run_id}: events/{name}.parquet is out of date; reading {name}.ndjson"))
                ndjson[name].append(nd)
            if nd.exists():
                torn = _partial_tail(nd, live)
                if torn:
                    found.append((PartialLineWarning,
                                  f"{run_id}: events/{name}.ndjson ends with a partial line "
                                  f"({torn} bytes, from an interrupted write); ignored"))
        for rep in manifest.get("repairs", []):
            found.append((PartialLineWarning,
                          f"{run_id}: events/{rep.get('file')} has a partial line ending at byte "
                          f"{rep.get('offset')} (interrupted write, repaired by writer generation "
                          f"{rep.get('gen')}); ignored"))

    for name in layout.EVENT_NAMES:
        con.execute(f"CREATE VIEW events_{name} AS {raw_events_sql(name, ndjson[name], parquet[name])}")
    for name, sql in _VIEW_SQL.items():
        con.execute(f"CREATE VIEW {name} AS {sql}")
    run_dirs = [rd for rd, _ in runs]
    _create_runs_view(con, run_dirs)
    files = [layout.manifest_path(rd) for rd in run_dirs]
    for name in layout.EVENT_NAMES:
        files += ndjson[name] + parquet[name]
    return Store(con=con, run_dirs=run_dirs, warnings=found, files=files)


def _create_runs_view(con: duckdb.DuckDBPyConnection, run_dirs: list[Path]) -> None:
    manifests = [layout.manifest_path(rd) for rd in run_dirs]
    cols = layout.MANIFEST_COLUMNS
    # Read live (not copied at open time) so a long-lived reader sees status and
    # ended_at change; manifests are replaced atomically, so never torn.
    con.execute(
        f"""CREATE VIEW runs AS
        SELECT {_select_list(cols)}, parse_dirpath(filename) AS run_dir
        FROM read_json({_sql_list(manifests)}, format='auto', columns={_columns_struct(cols)},
                       auto_detect=false, filename=true)"""
    )


def open_store(path: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the store views over ``path``.

    ``path`` is a run directory or a folder whose immediate children are run
    directories (the views then span all runs). Torn lines and stale Parquet
    copies are reported with ``warnings.warn`` (PartialLineWarning,
    StaleParquetWarning); use ``connect`` to get them as data instead.
    """
    store = connect(path)
    for category, message in store.warnings:
        warnings.warn(message, category, stacklevel=2)
    return store.con
