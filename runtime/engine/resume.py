"""What a resumed run needs from the sessions an interrupted run already finished: their
results (rewards, final replies, variables, and the engine's bookkeeping: buffer pushes,
stateful-function calls) for group routing, buffer contents and run-level histories, and
the groups whose route was already recorded. Read through the store's views, so only the
latest attempt of each session counts. Runs recorded before the `bookkeeping` column kept
it in `vars` under dunder names; those are still read."""

from __future__ import annotations

import json
from typing import Any, Iterable

from askspec.runtime.engine.plan import SessionPlan
from askspec.runtime.engine.state import SessionBook, SessionResult
from askspec.runtime.store.layout import RunDirError


def json_cell(v: Any) -> Any:
    """A JSON column's value as DuckDB hands it over (text) decoded; other values as is."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return v


def load_prior(run_dir: str, done: set[str], plans: Iterable[SessionPlan]) -> tuple[dict[str, SessionResult], set[str]]:
    from askspec.runtime.store.views import connect

    if not done:
        return {}, set()
    # The store's warnings (damaged lines and the like) were reported when the run
    # was reopened; repeating them as Python warnings would only add noise.
    con = connect(run_dir).con
    by_id = {p.session_id: p for p in plans if p.session_id in done}  # the plan is lazy: keep only these
    rows = con.execute("SELECT session_id, status, outcome, error, vars, attempt, bookkeeping FROM sessions "
                       "WHERE status IN ('ok', 'error')").fetchall()
    rewards: dict[str, list] = {}
    for sid, role, turn, name, value in con.execute("SELECT session_id, role, turn_index, name, value FROM rewards "
                                                    "WHERE value IS NOT NULL").fetchall():
        rewards.setdefault(sid, []).append((role, turn, name, float(value)))
    finals: dict[str, dict[str, str]] = {}
    firsts: dict[str, dict[str, str]] = {}
    for sid, role, text, prompt, rank_last, rank_first in con.execute(
            "SELECT session_id, role, text, prompt, "
            "row_number() OVER (PARTITION BY session_id, role ORDER BY turn_index DESC), "
            "row_number() OVER (PARTITION BY session_id, role ORDER BY turn_index) FROM turns "
            "WHERE group_id IS NULL").fetchall():  # a session's own turns, not its group's judge calls
        if rank_last == 1:
            finals.setdefault(sid, {})[role] = text or ""
        if rank_first == 1:
            messages = json_cell(prompt) or []
            users = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
            firsts.setdefault(sid, {})[role] = users[-1] if users else ""
    # a session's completion tokens (SessionResult.tokens): a live tournament's arrival order
    tokens = dict(con.execute("SELECT session_id, sum(tokens_out) FROM turns WHERE group_id IS NULL "
                              "GROUP BY session_id").fetchall())
    prior: dict[str, SessionResult] = {}
    for sid, status, outcome, error, vars_, attempt, bookkeeping in rows:
        if sid not in done or sid not in by_id:
            continue
        v = json_cell(vars_)
        v = v if isinstance(v, dict) else {}
        try:
            legacy = SessionBook.from_legacy_vars(v)  # also strips the old dunder keys from v
            book = SessionBook.from_json(json_cell(bookkeeping)) if bookkeeping is not None else legacy
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            # a hand-edited line of the right type but the wrong shape: resuming without
            # it would silently change buffers and histories
            raise RunDirError(f"events/sessions.ndjson: the recorded bookkeeping of session {sid} cannot be "
                              f"read ({type(e).__name__}: {e}); fix or remove that line to resume") from None
        if status != "ok":  # an errored session's pushes never entered a buffer
            book = SessionBook(stateful=book.stateful)
        prior[sid] = SessionResult(plan=by_id[sid], status=status, outcome=outcome, error=error,
                                   rewards=rewards.get(sid, []), final_texts=finals.get(sid, {}),
                                   first_prompts=firsts.get(sid, {}), tokens=int(tokens.get(sid) or 0),
                                   attempt=int(attempt or 1),
                                   vars={**by_id[sid].bindings, **v}, book=book)
    routed = {r[0] for r in con.execute("SELECT DISTINCT group_id FROM groups").fetchall()}
    return prior, routed
