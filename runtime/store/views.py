"""DuckDB views over one run directory or a folder of run directories.

Readers never open a ``.duckdb`` file: ``open_store`` creates an in-memory
connection whose views read the run's NDJSON event files (or their Parquet
copies once compacted) on every query, so they see new events while a writer
keeps appending, and nothing is locked.

Damaged lines. A writer only appends whole lines, but a crash can leave a torn
last line, a live writer may be mid-append while we scan, and files can be
damaged by hand. ``read_json(..., ignore_errors=true)`` turns an unparseable
line into an all-NULL row and a mistyped value into NULL; the views drop rows
lacking a required column (``layout.required``). Nothing is copied and no line
is scanned twice, so this costs nothing on the hot path. Warnings are computed
separately and cheaply: one small read at the end of each file (does it end in
``\\n``?), the manifest's record of lines a resume quarantined, and a scan of a
finished run's file only when it changed after the run ended (check.py).
Lines up to ``MAX_LINE_BYTES`` are read (see ``_max_object_size``).

Views (all carry ``run_id``; JSON-valued columns have DuckDB's JSON type;
``overflow`` lists strings stored aside, see overflow.py):

    runs(run_id, experiment, experiment_hash, status, started_at, ended_at, seed,
         planned_sessions, resumes, roles, params, versions, overrides, run_options,
         totals, duration_s, history, run_dir)
         (``status``: as shown, ``crashed`` or ``stale`` for a run whose process is gone,
         liveness.py; ``history``: one entry per process, with its own totals)
    sessions(run_id, session_id, game, group_id, status, outcome, error,
             started_at, ended_at, params, vars, attempt, index, bookkeeping, overflow, stage,
             step, weights, seed)
          (``step``, ``weights``: a training run's step and an evaluate stage's trained |
          initial, else NULL; a run of format < 4 kept them, and ``stage``, in ``params``;
          ``seed``: the session's sampling seed, NULL in a run of format < 6)
    turns(run_id, session_id, turn_index, role, model, prompt, text, parsed,
          finish_reason, tokens_in, tokens_out, latency_ms, error, attempt, ts, group_id, overflow,
          ttft_ms)
          (``prompt`` is rebuilt from the stored deltas, see _VIEW_SQL["turns"])
    rewards(run_id, session_id, role, turn_index, name, value, kind, attempt, ts, overflow)
    groups(run_id, group_id, route, stats, members, ts, judge_calls, unparsed, overflow)
    matches(run_id, group_id, a, b, first_shown, verdict, outcome, raw, ts, overflow)
    train_steps(run_id, role, step, loss, reward_mean, reward_std, zero_adv_share, kl,
                clip_frac, grad_norm, lr, tokens, seconds, metrics, ts, overflow, stage, skipped,
                mismatch_abs, mismatch_kl)
    (``skipped``: why the step's update did not run, NULL when it ran; layout.TRAIN_SKIP_REASONS;
    ``mismatch_abs``/``mismatch_kl``: the sampler vs the trainer on the step's on-policy tokens)
    (``stage``: the stage a session or step belongs to when the spec declares stages, else NULL)
    buffer_events(run_id, buffer, event, item, value, reason, score, best, replays, step,
                  phase, seq, ts, gen, overflow)   (push | rejected | replay | evict)
    buffer_items(run_id, buffer, item, value, pushed_step, replays, best, last_score)
                  (items pushed and not evicted)
    nested_events(run_id, step, event, dataset, copy, inner_step, value, data, seq, ts, gen,
                  overflow)   (the nested schedule's inner loop, see layout.py)
    rollouts(...)   token-level records of trained roles' turns (see rollouts.py)

Sources: per event file, the NDJSON or its Parquet copy, as ``layout.copy_state``
says (a copy that is the only record, or holds more than a shrunk NDJSON, is
read instead of it).

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
VIEW_NAMES = ("runs", "sessions", "turns", "rewards", "groups", "matches", "train_steps", "buffer_events",
              "buffer_items", "nested_events", "rollouts")


class StoreError(Exception):
    """The path is not a run directory or a folder of runs."""


class PartialLineWarning(UserWarning):
    """An event file has a torn line from an interrupted write; it is ignored."""


class StaleParquetWarning(UserWarning):
    """A Parquet copy no longer matches its NDJSON file; the more complete one is read."""


class DamagedRunWarning(UserWarning):
    """A run (or one of its files) is damaged: skipped, or read without the damaged part."""


# A finished run's file edited afterwards is scanned for damaged lines up to this
# size, to name them; a larger one gets a warning without line numbers.
SCAN_CHANGED_BYTES = 16 << 20


def _changed_since_closed(manifest: dict, name: str, nd: Path) -> tuple[bool, str]:
    """(whether events/<name>.ndjson is exactly as its writer closed it, see
    check.file_stamp; a warning about damaged lines when it changed since)."""
    from askspec.runtime.store import check

    closed = manifest.get("closed_files")
    stamp = closed.get(name) if isinstance(closed, dict) else None
    if stamp is None:
        return False, ""  # no stamp (a live or crashed run, or an older version)
    now = check.file_stamp(nd)
    if now == stamp:
        return True, ""
    if now is None or now[0] > SCAN_CHANGED_BYTES:
        return False, (f"events/{name}.ndjson changed after the run ended; lines that cannot be read are "
                       "skipped (askspec run --resume moves them to events/quarantine.ndjson)")
    try:
        bad = [b for b in check.scan_file(nd, name) if not b.torn]  # a torn last line is warned about apart
    except OSError:
        return False, ""
    if not bad:
        return False, ""
    shown = "; ".join(f"line {b.line}: {b.reason}" for b in bad[:3]) + ("; ..." if len(bad) > 3 else "")
    return False, (f"events/{name}.ndjson has {len(bad)} damaged line(s), skipped ({shown}); "
                   "askspec run --resume moves them to events/quarantine.ndjson")


def _parquet_missing(con: duckdb.DuckDBPyConnection, pq: Path, name: str, fmt: int) -> tuple[str, ...]:
    """Columns of event file ``name`` that Parquet copy ``pq`` lacks (see layout.ADDED_COLUMNS)."""
    if fmt >= layout.FORMAT_VERSION:
        return ()
    if fmt == 1:
        return layout.ADDED_COLUMNS[name]
    # Unknown (no index entry): read the file's schema (metadata only).
    try:
        have = {r[0] for r in con.execute("SELECT name FROM parquet_schema(?)", [os.fspath(pq)]).fetchall()}
    except duckdb.Error:
        return ()
    return tuple(c for c in layout.columns(name) if c not in have)


@dataclass
class Store:
    """An open store: the connection, the run dirs it spans, and what to warn about.

    ``files`` are the files its views read (manifests, NDJSON event files, Parquet
    copies): all a confined connection needs access to (see ``readonly``)."""

    con: duckdb.DuckDBPyConnection
    run_dirs: list[Path]
    warnings: list[tuple[type[Warning], str]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    # run_id -> event file kind -> where its events are read from: for readers that keep
    # a copy of a run of their own (the TUI)
    sources: dict[str, dict[str, EventSource]] = field(default_factory=dict)


@dataclass(frozen=True)
class EventSource:
    """The file one run's events of one kind are read from: its NDJSON file, or its
    Parquet copy (``missing``: columns the copy lacks, read as NULL)."""

    path: Path
    missing: tuple[str, ...] = ()

    def sql(self, name: str) -> str:
        """``raw_events_sql`` over this file alone."""
        if self.path.suffix == ".parquet":
            return raw_events_sql(name, [], [self.path], {self.path: self.missing} if self.missing else None)
        return raw_events_sql(name, [self.path], [])


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


# Lines up to this size are read; the writer keeps its lines under ~4 MiB (longer
# strings go to events/overflow/), so this only matters for runs written by older
# versions or by hand. DuckDB's default (16 MiB) made one huge reply break every query.
# DuckDB reads a file in buffers of twice the maximum object size, counted against its
# memory limit: 256 MiB keeps one scan's buffer at 512 MiB (1 GiB made it 2 GiB, and a
# query's default limit is 1 GiB, see readonly.py).
MAX_LINE_BYTES = 256 << 20
# No line is longer than its file: each read_json call is given the size of its largest
# file rounded up to a power of two, at least MIN_LINE_BYTES (above the writer's longest
# line, so a file that grows after the views are made stays readable) and at most
# MAX_LINE_BYTES. A run of small files then needs 32 MiB a scan, not 512.
MIN_LINE_BYTES = 16 << 20


def _max_object_size(paths: list[Path]) -> int:
    largest = 0
    for p in paths:
        try:
            largest = max(largest, os.stat(p).st_size)
        except OSError:
            pass
    return min(MAX_LINE_BYTES, max(MIN_LINE_BYTES, 1 << largest.bit_length()))


def _where_valid(name: str) -> str:
    # ignore_errors turns an unparseable line into an all-NULL row and a mistyped
    # value into NULL: drop rows that lack what gives a line its meaning.
    return " AND ".join(f'"{c}" IS NOT NULL' for c in layout.required(name))


def one_row(con: duckdb.DuckDBPyConnection, sql: str) -> tuple:
    """The row of a statement that returns exactly one (a COPY's count, a count(*))."""
    row = con.execute(sql).fetchone()
    assert row is not None, sql
    return row


def raw_events_sql(name: str, ndjson: list[Path], parquet: list[Path],
                   parquet_missing: dict[Path, tuple[str, ...]] | None = None) -> str:
    """SQL for all raw events of file kind ``name`` across runs, typed per layout.

    ``parquet_missing`` names, per Parquet copy, columns it lacks (copies made
    before a column existed); they read as NULL.
    """
    cols = layout.columns(name)
    sel = _select_list(cols)
    parts = []
    if ndjson:
        parts.append(
            f"SELECT {sel} FROM read_json({_sql_list(ndjson)}, format='newline_delimited', "
            f"columns={_columns_struct(cols)}, auto_detect=false, ignore_errors=true, "
            f"maximum_object_size={_max_object_size(ndjson)}) WHERE {_where_valid(name)}"
        )
    groups: dict[tuple[str, ...], list[Path]] = {}
    for p in parquet:
        groups.setdefault(tuple((parquet_missing or {}).get(p, ())), []).append(p)
    for missing, paths in groups.items():
        items = ", ".join(
            f'CAST(NULL AS {t}) AS "{c}"' if c in missing else f'"{c}"' for c, t in cols.items()
        )
        parts.append(f"SELECT {items} FROM read_parquet({_sql_list(paths)}) WHERE {_where_valid(name)}")
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
               s.ts AS started_at, f.ts AS ended_at, s.params, f.vars, s.attempt, s."index", f.bookkeeping,
               CASE WHEN s.overflow IS NULL THEN f.overflow WHEN f.overflow IS NULL THEN s.overflow
                    ELSE ('[' || s.overflow[2:-2] || ',' || f.overflow[2:-2] || ']')::JSON END AS overflow,
               coalesce(s.stage, s.params->>'__stage__') AS stage,
               coalesce(s.step, TRY_CAST(s.params->>'__step__' AS BIGINT)) AS step,
               coalesce(s.weights, s.params->>'__weights__') AS weights,
               s.seed
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
    # A turn stores its prompt as a delta (layout.py): the full prompt is the
    # concatenation of the message arrays of its chain, from the turn that stored
    # it whole up to this one. It is NULL when a line of the chain is missing
    # (quarantined): each delta records its link number, which must equal the
    # number of chain rows before it (a gap shifts every later row). DuckDB drops
    # this window when a query does not use ``prompt``, and pushes a session_id
    # filter below it.
    "turns": """
        SELECT t.run_id, t.session_id, t.turn_index, t.role, t.model,
               CASE WHEN t.prompt_chain IS NULL THEN t.prompt
                    WHEN t.prompt_link = row_number() OVER chain - 1
                    THEN ('[' || string_agg(nullif(t.prompt[2:-2], ''), ',') OVER chain || ']')::JSON
               END AS prompt,
               t.text, t.parsed,
               t.finish_reason, t.tokens_in, t.tokens_out, t.latency_ms, t.error, t.attempt, t.ts, t.group_id,
               t.overflow, t.ttft_ms
        FROM events_turns t
        ANTI JOIN retried_sessions r
          ON r.run_id = t.run_id AND r.session_id = t.session_id AND r.attempt <> t.attempt
        ANTI JOIN rerouted_groups g
          ON g.run_id = t.run_id AND g.group_id = t.group_id AND g.gen <> t.gen
        WINDOW chain AS (PARTITION BY t.run_id, t.session_id, t.attempt, coalesce(t.prompt_chain, t.turn_index)
                         ORDER BY t.turn_index ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
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
        SELECT w.run_id, w.session_id, w.role, w.turn_index, w.name, w.value, w.kind, w.attempt, w.ts, w.overflow
        FROM events_rewards w
        ANTI JOIN retried_sessions r
          ON r.run_id = w.run_id AND r.session_id = w.session_id AND r.attempt <> w.attempt
        LEFT JOIN rewarded_again a
          ON a.run_id = w.run_id AND a.session_id = w.session_id AND a.attempt = w.attempt
         AND a.role = w.role AND a.turn_index IS NOT DISTINCT FROM w.turn_index AND a.name = w.name
        WHERE a.gen IS NULL OR a.gen = w.gen
    """,
    "groups": """
        SELECT run_id, group_id, route, stats, members, ts, judge_calls, unparsed, overflow FROM events_groups
        QUALIFY row_number() OVER (PARTITION BY run_id, group_id ORDER BY seq DESC) = 1
    """,
    "matches": """
        SELECT run_id, group_id, a, b, first_shown, verdict, outcome, raw, ts, overflow FROM events_matches
        QUALIFY gen = max(gen) OVER (PARTITION BY run_id, group_id)
    """,
    "train_steps": """
        SELECT run_id, role, step, loss, reward_mean, reward_std, zero_adv_share, kl, clip_frac, grad_norm, lr,
               tokens, seconds, metrics, ts, overflow, metrics->>'stage' AS stage, skipped, mismatch_abs, mismatch_kl
        FROM events_train_steps
        QUALIFY row_number() OVER (PARTITION BY run_id, role, step ORDER BY seq DESC) = 1
    """,
    # a replayed training step (after --resume) writes its buffer events again: per step,
    # only the latest writer generation's events count
    "buffer_events": """
        SELECT run_id, buffer, event, item, value, reason, score, best, replays, step, phase, seq, ts, gen, overflow
        FROM events_buffer_events
        QUALIFY gen = max(gen) OVER (PARTITION BY run_id, step)
    """,
    # as buffer_events: a replayed outer step's events supersede the earlier generation's
    "nested_events": """
        SELECT run_id, step, event, dataset, copy, inner_step, value, data, seq, ts, gen, overflow
        FROM events_nested_events
        QUALIFY gen = max(gen) OVER (PARTITION BY run_id, step)
    """,
    # what each buffer holds now (or held when the run ended): items pushed and not evicted
    "buffer_items": """
        SELECT p.run_id, p.buffer, p.item, p.value, p.step AS pushed_step,
               coalesce(r.replays, 0) AS replays, r.best, r.score AS last_score
        FROM buffer_events p
        LEFT JOIN (SELECT run_id, buffer, item, max(replays) AS replays, arg_max(best, seq) AS best,
                          arg_max(score, seq) AS score
                   FROM buffer_events WHERE event = 'replay' GROUP BY ALL) r
          ON r.run_id = p.run_id AND r.buffer = p.buffer AND r.item = p.item
        WHERE p.event = 'push'
          AND NOT EXISTS (SELECT 1 FROM buffer_events e WHERE e.event = 'evict' AND e.run_id = p.run_id
                          AND e.buffer = p.buffer AND e.item = p.item)
    """,
}


def connect(path: str | os.PathLike[str]) -> Store:
    """Open ``path`` (a run dir or a folder of run dirs) and define the views.

    Raises StoreError if ``path`` holds no run. Warnings are collected in
    ``Store.warnings`` rather than emitted, so callers choose how to show them.
    """
    from askspec.runtime.store.rollouts import create_view, shards

    root = Path(path)
    if not root.exists():
        raise StoreError(f"no such directory: {root}")
    if not root.is_dir():
        raise StoreError(f"not a directory: {root}")
    found: list[tuple[type[Warning], str]] = []
    runs: list[tuple[Path, dict]] = []
    problems: list[str] = []
    for rd in layout.find_run_dirs(root):
        why = layout.refused_file(rd, layout.MANIFEST)
        if why:
            problems.append(f"{rd}: {why}: {layout.REFUSED_HINT}")
            found.append((DamagedRunWarning, f"{rd}: {why}: run skipped ({layout.REFUSED_HINT})"))
            continue
        try:
            manifest = layout.load_manifest(rd)
        except layout.ManifestError as e:
            problems.append(str(e))
            found.append((DamagedRunWarning, f"{e}; run skipped"))
            continue
        runs.append((rd.resolve(), manifest))
    if not runs:
        if len(problems) == 1:
            raise StoreError(f"cannot read run: {problems[0]}")
        raise StoreError(f"not a run directory or a folder of runs: {root}"
                         + (f" ({len(problems)} runs with unreadable manifests)" if problems else ""))

    con = duckdb.connect(":memory:")
    ndjson: dict[str, list[Path]] = {n: [] for n in layout.EVENT_NAMES}
    parquet: dict[str, list[Path]] = {n: [] for n in layout.EVENT_NAMES}
    missing_cols: dict[str, dict[Path, tuple[str, ...]]] = {n: {} for n in layout.EVENT_NAMES}
    sources: dict[str, dict[str, EventSource]] = {}
    side_files: dict[Path, list[Path]] = {}
    for rd, manifest in runs:
        run_id = manifest["run_id"]
        live = manifest["status"] == "running"
        index = layout.read_compaction_index(rd)
        mine = sources[run_id] = {}
        for name in layout.EVENT_NAMES:
            nd = layout.ndjson_path(rd, name)
            state = layout.copy_state(rd, name, index)  # a refused file counts as absent
            refused = [why for rel in (f"{layout.EVENTS_DIR}/{name}.ndjson", f"{layout.EVENTS_DIR}/{name}.parquet")
                       if (why := layout.refused_file(rd, rel))]
            for why in refused:
                found.append((DamagedRunWarning, f"{run_id}: {why}: {layout.REFUSED_HINT}"))
            if state.kind in ("current", "only", "ahead"):
                pq = layout.parquet_path(rd, name)
                parquet[name].append(pq)
                missing = _parquet_missing(con, pq, name, state.format_version)
                if missing:
                    missing_cols[name][pq] = missing
                mine[name] = EventSource(pq, missing)
                if state.kind == "ahead":
                    found.append((StaleParquetWarning,
                                  f"{run_id}: events/{name}.ndjson ({state.ndjson_bytes} bytes) is shorter than "
                                  f"when it was compacted ({state.built_from} bytes); reading {name}.parquet"))
            elif state.ndjson_bytes is not None:
                if state.kind == "stale":
                    found.append((StaleParquetWarning,
                                  f"{run_id}: events/{name}.parquet is out of date; reading {name}.ndjson"))
                ndjson[name].append(nd)
                mine[name] = EventSource(nd)
            elif name not in layout.LATER_EVENTS and not refused:
                found.append((DamagedRunWarning,
                              f"{run_id}: events/{name}.ndjson is missing; no {name} events for this run"))
            if not state.ndjson_bytes or state.kind in ("current", "only", "ahead"):
                continue
            untouched, damage = _changed_since_closed(manifest, name, nd)
            if damage:
                found.append((DamagedRunWarning, f"{run_id}: {damage}"))
            if not untouched:
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
        # full texts of strings stored aside (a query may read_text() them), rollout shards
        refused_side: list[str] = []
        side_files[rd] = _overflow_files(rd, refused_side) + shards(rd, refused_side)
        if refused_side:
            shown = "; ".join(refused_side[:3]) + ("; ..." if len(refused_side) > 3 else "")
            found.append((DamagedRunWarning, f"{run_id}: {shown}: {layout.REFUSED_HINT}"))
        moved = sum(int(q.get("lines", 0) or 0) for q in manifest.get("quarantined", []))
        if moved:
            damaged = sorted({str(q.get("file")) for q in manifest.get("quarantined", [])})
            found.append((DamagedRunWarning,
                          f"{run_id}: {moved} damaged line(s) of {', '.join(damaged)} were moved to "
                          f"events/{layout.QUARANTINE} by a resume; not in the views"))

    for name in layout.EVENT_NAMES:
        sql = raw_events_sql(name, ndjson[name], parquet[name], missing_cols[name])
        con.execute(f"CREATE VIEW events_{name} AS {sql}")
    define_views(con)
    run_dirs = [rd for rd, _ in runs]
    _create_runs_view(con, run_dirs)
    create_view(con, run_dirs)
    files = [layout.manifest_path(rd) for rd in run_dirs]
    for name in layout.EVENT_NAMES:
        files += ndjson[name] + parquet[name]
    for rd in run_dirs:
        files += side_files[rd]
    return Store(con=con, run_dirs=run_dirs, warnings=found, files=files, sources=sources)


def _overflow_files(rd: Path, refused: list[str]) -> list[Path]:
    """The files of ``events/overflow`` a query may ``read_text`` (regular files, see
    ``layout.refused_file``); why each other entry there is not read goes to ``refused``."""
    ok: list[Path] = []
    folder = layout.events_dir(rd) / layout.OVERFLOW_DIR
    for p in sorted(folder.glob("*")):
        if p.name.startswith("."):  # a side file being written
            continue
        why = layout.refused_file(rd, f"{layout.EVENTS_DIR}/{layout.OVERFLOW_DIR}/{p.name}")
        if why:
            refused.append(why)
        else:
            ok.append(p)
    return ok


def define_views(con: duckdb.DuckDBPyConnection) -> None:
    """Create the views (all but ``runs`` and ``rollouts``) over relations named
    ``events_<name>`` that ``con`` already has, one per event file kind with
    ``raw_events_sql``'s columns.

    ``connect`` defines them over the run's files; a reader holding a copy of some
    events in tables of its own (the TUI) gets the same semantics over those."""
    for name, sql in _VIEW_SQL.items():
        con.execute(f"CREATE VIEW {name} AS {sql}")


def _create_runs_view(con: duckdb.DuckDBPyConnection, run_dirs: list[Path]) -> None:
    from askspec.runtime.store import liveness

    manifests = [layout.manifest_path(rd) for rd in run_dirs]
    cols = layout.MANIFEST_COLUMNS
    # Read live (not copied at open time) so a long-lived reader sees status and
    # ended_at change; manifests are replaced atomically, so never torn. The status is
    # the one shown (liveness.py: a run whose process is gone is crashed or stale),
    # decided at each query.
    liveness.register(con)
    shown = {"status": f"{liveness.SQL_FUNCTION}(\"status\", CAST(\"history\"->-1 AS VARCHAR)) AS \"status\""}
    con.execute(
        f"""CREATE VIEW runs AS
        SELECT {", ".join(shown.get(c, f'"{c}"') for c in cols)}, parse_dirpath(filename) AS run_dir
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
