"""``askspec runs [DIR]``: one line per run, enough to tell runs apart — status, how long
it ran, session counts, tokens, the models each role ran on (backend, served model,
endpoint) and the settings it ran with (--seed, --profile, --eval-only, --set values,
--sessions, --concurrency, --max-tokens, ...). Runs in subfolders of DIR are found too. ``list_runs`` is the same
data for the TUI."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from askspec.runtime.commands.query import _error, _guarded, _print_warnings, format_table
from askspec.runtime.store import layout, liveness
from askspec.runtime.store.describe import json_value, models_text, settings_text
from askspec.runtime.store.views import connect

_RUNS_SQL = """
    SELECT r.run_id, r.experiment, r.experiment_hash, r.status, r.started_at, r.ended_at,
           r.seed, r.planned_sessions, r.resumes, r.run_dir, r.roles, r.overrides, r.run_options,
           r.totals, r.duration_s, r.history,
           coalesce(s.ok, 0) AS ok, coalesce(s.error, 0) AS error,
           coalesce(s.running, 0) AS running
    FROM runs r LEFT JOIN (
        SELECT run_id,
               count(*) FILTER (WHERE status = 'ok')      AS ok,
               count(*) FILTER (WHERE status = 'error')   AS error,
               count(*) FILTER (WHERE status = 'running') AS running
        FROM sessions GROUP BY run_id
    ) s USING (run_id)
    ORDER BY r.started_at, r.run_id
"""

# Runs whose process has not recorded its end (running, crashed, stale): the manifest's
# totals are those of the processes that ended, so they are counted from their turns.
_TOKENS_SQL = """
    SELECT run_id, count(*) AS turns, coalesce(sum(tokens_in), 0) AS tokens_in,
           coalesce(sum(tokens_out), 0) AS tokens_out
    FROM turns WHERE run_id IN ({ids}) GROUP BY run_id
"""


def list_runs(dir: str | Path) -> list[dict[str, Any]]:
    """One dict per run under ``dir`` (subfolders included; or ``dir`` itself if it is a
    run), oldest first. An existing folder without runs gives an empty list.

    Keys: run_id, experiment, experiment_hash, status (as shown: ``crashed`` or ``stale``
    for a run whose process is gone, liveness.py), started_at, ended_at, seed,
    planned_sessions, resumes, run_dir, ok, error, running (session counts), duration_s
    (every process's time, the latest one's so far), tokens_in, tokens_out, turns (all
    processes'), roles, overrides, run_options, history (decoded JSON), and the one-line
    texts ``models`` and ``settings``.
    """
    root = Path(dir)
    if root.is_dir() and not layout.find_run_dirs(root):
        return []
    store = connect(root)
    try:
        return _rows(store.con)
    finally:
        store.con.close()


def _rows(con) -> list[dict[str, Any]]:
    rows = con.sql(_RUNS_SQL).to_arrow_table().to_pylist()
    for r in rows:
        for key in ("roles", "overrides", "run_options", "totals", "history"):
            r[key] = json_value(r[key])
    unended = {r["run_id"] for r in rows if r["status"] in ("running", *liveness.NOT_RUNNING)}
    for r in rows:
        if r["run_id"] in unended:
            r["duration_s"] = liveness.run_seconds(r["history"], live=r["status"] == "running")
    missing = [r["run_id"] for r in rows if not r["totals"] or r["run_id"] in unended]
    counted: dict[str, dict] = {}
    if missing:
        ids = ", ".join("'" + str(i).replace("'", "''") + "'" for i in missing)
        for run_id, turns, t_in, t_out in con.execute(_TOKENS_SQL.format(ids=ids)).fetchall():
            counted[run_id] = {"turns": turns, "tokens_in": t_in, "tokens_out": t_out}
    for r in rows:
        totals = counted.get(r["run_id"]) or r["totals"] or {}  # (counted: the unended runs and those without totals)
        r["turns"] = totals.get("turns", 0)
        r["tokens_in"] = totals.get("tokens_in", 0)
        r["tokens_out"] = totals.get("tokens_out", 0)
        r["models"] = models_text(r["roles"])
        r["settings"] = settings_text(r["run_options"], r["overrides"], r["seed"])
    return rows


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return ""
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


@_guarded
def cmd_runs(args: argparse.Namespace) -> int:
    """askspec runs [DIR] [--format table|json]"""
    root = Path(args.dir)
    if not root.exists():
        return _error(f"no such directory: {root}")
    if not layout.find_run_dirs(root):
        print(f"no runs in {root}")
        return 0
    store = connect(root)
    _print_warnings(store)
    try:
        rows = _rows(store.con)
    finally:
        store.con.close()
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2, default=str, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    table = pa.table({
        "run_id": [r["run_id"] for r in rows],
        "experiment": [r["experiment"] for r in rows],
        "status": [r["status"] for r in rows],
        "started": [r["started_at"] for r in rows],
        "duration": [_duration(r["duration_s"]) for r in rows],
        "ok": [r["ok"] for r in rows],
        "error": [r["error"] for r in rows],
        "running": [r["running"] for r in rows],
        "planned": [r["planned_sessions"] for r in rows],
        "tokens_in": [r["tokens_in"] for r in rows],
        "tokens_out": [r["tokens_out"] for r in rows],
        "models": [r["models"] for r in rows],
        "settings": [r["settings"] for r in rows],
        "hash": [(r["experiment_hash"] or "")[:12] for r in rows],
    })
    print(format_table(table, max_width=0))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("runs", help="list runs: status, sessions, tokens, models and settings",
                              description="List the runs in DIR and its subfolders: status, duration, session "
                                          "counts, tokens, the model (backend, endpoint) of each role and the "
                                          "settings each run was started with.")
    p.add_argument("dir", metavar="DIR", nargs="?", default="runs", help="folder of runs (default: runs)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_runs)
