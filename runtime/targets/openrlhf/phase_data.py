"""A buffer across the phases of an OpenRLHF job (PasoDoble offline: game `propose` fills
`questions` in the proposer's phase, game `practice` replays it in the solver's).

driver.sh runs, around every phase of a job whose games push to or replay a buffer:

- `prompts JOB PHASE` before the phase: a phase whose game replays a buffer gets its
  prompt data set (PHASE/prompts.jsonl) from the buffer as it stands: `steps` batches of
  `items` in circular order, as the local schedule draws a replaying step's items
  (ReplayBuffer.next_batch). Nothing is saved, so a phase started again after a failure
  draws the same batches.
- `commit JOB PHASE RUNS KEY` after it (`committed JOB KEY` asks whether it ran): the phase's replays (each drawn item's mean score
  over the sessions that played it, per step) and then its pushes (the ok sessions of
  the run stores its agent wrote under RUNS, as `--resume` reads them: engine/resume.py's
  bookkeeping; in the order of the phase's prompts, whatever order OpenRLHF played them
  in) enter the buffers, with evictions as ReplayBuffer
  makes them. The buffers' state goes to JOB/buffers/state.json (ReplayBuffer.state(),
  as the local trainer's checkpoints/buffers/step-N.json) and its events to
  JOB/buffers/events/KEY.ndjson (the run store's buffer_events fields, with the iteration
  and phase; read_events lists them in commit order). A KEY already committed is
  skipped, so a re-run never commits twice.

Only evictions that do not depend on a replay's score can be drawn ahead of a phase
(check.py refuses the others with E605)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from askspec.ir import model as ir
from askspec.ir.plansize import replays_buffer

from askspec.runtime.engine.resume import json_cell
from askspec.runtime.engine.state import SessionBook
from askspec.runtime.scoring.buffers import ReplayBuffer
from askspec.runtime.store.layout import write_json_atomic

STATE = Path("buffers") / "state.json"
EVENTS_DIR = Path("buffers") / "events"  # KEY.ndjson: the events of the phase committed as KEY
PLAN = "replays.json"  # in a replaying phase's folder: the item ids of each step, as `prompts` drew them


class PhaseDataError(Exception):
    """The buffers cannot be read or written (one line for the user, no traceback)."""


def _job(phase_dir: Path) -> tuple[dict, ir.Experiment]:
    job = json.loads((phase_dir / "job.json").read_text(encoding="utf-8"))
    return job, ir.Experiment.model_validate(job["experiment"])


def _state(job_root: Path) -> dict:
    path = job_root / STATE
    if not path.exists():
        return {"buffers": {}, "committed": []}
    return json.loads(path.read_text(encoding="utf-8"))


def _buffers(exp: ir.Experiment, state: dict, events: list[dict] | None) -> dict[str, ReplayBuffer]:
    """The spec's buffers as `state` holds them (the engine's construction, session.py)."""
    out = {}
    for b in exp.buffers:
        buf = ReplayBuffer(b.name, b.capacity, b.eviction, int(b.options.get("patience", 3)),
                           on_event=events.append if events is not None else None, best_field=b.options.get("best"))
        if b.name in state["buffers"]:
            buf.restore(state["buffers"][b.name])
        out[b.name] = buf
    return out


def _draw(buf: ReplayBuffer, steps: int, items: int) -> list[list[tuple[int, Any]]]:
    """The phase's batches: `steps` calls of next_batch(items), as the local schedule's steps."""
    return [buf.next_batch(items) for _ in range(steps)]


def prompts(job_root: Path, phase_dir: Path) -> int:
    """Write a replaying phase's prompts.jsonl and replays.json; the number of prompts
    (0 when the buffer is empty, or the phase replays none)."""
    from askspec.runtime.targets.openrlhf.generate import prompt_line

    job, exp = _job(phase_dir)
    replay = job.get("replay")
    if not replay:
        return 0
    game = next(g for g in exp.games if g.name == replay["game"])
    buf = _buffers(exp, _state(job_root), None)[replay["buffer"]]
    batches = _draw(buf, int(replay["steps"]), int(replay["items"]))
    lines, plan = [], []
    for batch in batches:
        plan.append([item_id for item_id, _ in batch])
        for item_id, item in batch:
            bindings = {game.pattern[0]: item} if len(game.pattern) == 1 else dict(zip(game.pattern, list(item)))
            lines.append(prompt_line(game.name, item_id, bindings))
    # an empty buffer leaves an empty data set: driver.sh skips the phase, as a local step
    # with nothing to replay plays no session
    (phase_dir / "prompts.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                                             encoding="utf-8")
    write_json_atomic(phase_dir / PLAN, plan)
    return len(lines)


def _sessions(runs: Path) -> list[tuple[dict, str, SessionBook, dict, str]]:
    """(bindings, status, bookkeeping, vars, game) of every session the phase's agents
    recorded under `runs`, in the order they started (run by run). Only the latest
    attempt counts (the sessions view)."""
    from askspec.runtime.store.views import StoreError, connect

    if not runs.exists() or not any(runs.iterdir()):
        return []
    try:
        con = connect(runs).con
    except StoreError as e:
        raise PhaseDataError(f"cannot read the phase's run stores in {runs}: {e}") from None
    rows = con.execute('SELECT s.params, s.status, s.bookkeeping, s.vars, s.game FROM sessions s '
                       'JOIN runs r USING (run_id) ORDER BY r.started_at, s.run_id, s."index"').fetchall()
    out = []
    for params, status, bookkeeping, vars_, game in rows:
        bindings = json_cell(params) if params is not None else {}
        v = json_cell(vars_) if vars_ is not None else {}
        out.append((bindings if isinstance(bindings, dict) else {}, str(status),
                    SessionBook.from_json(json_cell(bookkeeping)) if bookkeeping is not None else SessionBook(),
                    v if isinstance(v, dict) else {}, str(game)))
    return out


def _prompt_order(phase_dir: Path, job: dict, sessions: list) -> list:
    """`sessions` in the order of the phase's prompts.jsonl, as the local schedule plays
    its elements, whatever order OpenRLHF ran them in (its data loader shuffles the
    prompts) and however many rollout processes recorded them: the k-th session of a
    prompt belongs to that prompt's (k // sessions per prompt)-th pass; a prompt's
    sessions keep the order they started in."""
    first: dict[tuple[str, str], int] = {}
    for pos, line in enumerate((phase_dir / "prompts.jsonl").read_text(encoding="utf-8").splitlines()):
        label = json.loads(json.loads(line)["label"])
        first.setdefault((label["game"], _key(label.get("bindings") or {})), pos)
    siblings = job.get("siblings") or {}
    seen: dict[tuple[str, str], int] = {}
    keyed = []
    for n, row in enumerate(sessions):
        k = (row[4], _key(row[0]))
        per_prompt = 1 if row[4] in siblings else max(1, int(job["group"]))
        count = seen[k] = seen.get(k, 0) + 1
        keyed.append(((count - 1) // per_prompt, first.get(k, len(first)), n, row))
    return [row for *_, row in sorted(keyed, key=lambda x: x[:3])]


def _key(bindings: dict) -> str:
    return json.dumps(bindings, sort_keys=True, ensure_ascii=False, default=str)


def commit(job_root: Path, phase_dir: Path, runs: Path, key: str, iteration: int) -> list[dict]:
    """Commit a finished phase's replays and pushes to the job's buffers; the new events."""
    state = _state(job_root)
    if key in state["committed"]:
        return []
    job, exp = _job(phase_dir)
    events: list[dict] = []
    buffers = _buffers(exp, state, events)
    sessions = _sessions(runs)
    replay = job.get("replay")
    if replay:
        game = next(g for g in exp.games if g.name == replay["game"])
        buf = buffers[replay["buffer"]]
        plan = json.loads((phase_dir / PLAN).read_text(encoding="utf-8"))
        batches = _draw(buf, int(replay["steps"]), int(replay["items"]))  # advances the cursor as the phase did
        if [[i for i, _ in b] for b in batches] != plan:
            raise PhaseDataError(f"{phase_dir / PLAN} does not match buffer '{buf.name}' as it stands: run the "
                                 f"phase again from `prompts` (driver.sh does)")
        score = next(b.score for b in exp.buffers if b.name == buf.name)
        played: dict[str, list[Any]] = {}  # an item's sessions' scores, in session order
        for bindings, status, _, v, _ in sessions:
            if status == "ok":
                played.setdefault(_key(bindings), []).append(v.get(score) if score else None)
        for step, batch in enumerate(batches, 1):
            mark = len(events)
            for item_id, item in batch:
                bindings = {game.pattern[0]: item} if len(game.pattern) == 1 else dict(zip(game.pattern, list(item)))
                got = played.get(_key(bindings), [])
                value = got.pop(0) if got else None  # this step's session of the item
                nums = [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []
                buf.replayed(item_id, sum(nums) / len(nums) if nums else None)
            for ev in events[mark:]:
                ev["phase_step"] = step
    for _, status, book, _, _ in _prompt_order(phase_dir, job, sessions):
        if status != "ok":  # an errored session's pushes never entered a buffer (resume.py)
            continue
        for name, value in book.pushes:
            if name in buffers:
                buffers[name].add(value)
    for ev in events:
        ev.update(iteration=iteration, phase=phase_dir.name)
    # the phase's events first, under its key (a commit run again after a kill rewrites the
    # same file), then the state naming the key: the commit point
    events_file = job_root / EVENTS_DIR / f"{key}.ndjson"
    events_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = events_file.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(ev, ensure_ascii=False, default=str) + "\n" for ev in events), encoding="utf-8")
    tmp.replace(events_file)
    state = {"buffers": {name: b.state() for name, b in buffers.items()}, "committed": [*state["committed"], key]}
    write_json_atomic(job_root / STATE, state)
    return events


def read_events(job_root: Path) -> list[dict]:
    """Every committed phase's buffer events, in commit order."""
    out: list[dict] = []
    for key in _state(job_root)["committed"]:
        text = (job_root / EVENTS_DIR / f"{key}.ndjson").read_text(encoding="utf-8")
        out += [json.loads(line) for line in text.splitlines()]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m askspec.runtime.targets.openrlhf.phase_data",
                                 description="a job's buffers around its phases (driver.sh runs it)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts", help="write a replaying phase's prompt data set from the buffer as it stands")
    p.add_argument("job")
    p.add_argument("phase")
    c = sub.add_parser("commit", help="commit a finished phase's replays and pushes to the buffers")
    c.add_argument("job")
    c.add_argument("phase")
    c.add_argument("runs")
    c.add_argument("key")
    c.add_argument("--iteration", type=int, default=1)
    k = sub.add_parser("committed", help="exit 0 when KEY's phase is committed already (else 1)")
    k.add_argument("job")
    k.add_argument("key")
    a = ap.parse_args(argv)
    job = Path(a.job)
    try:
        if a.cmd == "committed":
            return 0 if a.key in _state(job)["committed"] else 1
        if a.cmd == "prompts":
            n = prompts(job, job / a.phase)
            print(f"phase {a.phase}: {n} prompt(s) drawn from the buffer", file=sys.stderr)
        else:
            events = commit(job, job / a.phase, Path(a.runs), a.key, a.iteration)
            print(f"phase {a.phase}: {len(events)} buffer event(s) committed", file=sys.stderr)
    except (PhaseDataError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
