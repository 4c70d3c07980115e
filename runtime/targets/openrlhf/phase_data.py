"""A buffer across the phases of an OpenRLHF job (PasoDoble offline: game `propose` fills
`questions` in the proposer's phase, game `practice` replays it in the solver's).

driver.sh runs, around every phase of a job whose games push to or replay a buffer:

- `prompts JOB PHASE --iteration N` before the phase writes its prompt data set
  (PHASE/prompts.jsonl) as the local alternating schedule plays the phase's steps of
  iteration N: a replaying phase gets `steps` batches of `items` drawn from the buffer as
  it stands, in circular order (ReplayBuffer.next_batch; from a buffer shorter than a
  batch, every step all of it, and PHASE/launch.args says so to launch.sh); a pushing phase the game
  elements those steps take from PHASE/elements.jsonl (the StepPlanner's walk: whole
  groups, in plan order, cycling, continuing where the role's previous phase stopped).
  Each prompt's label names its local step. Nothing is saved, so a phase started again
  after a failure gets the same prompts.
- `commit JOB PHASE RUNS KEY --iteration N` after it (`committed JOB KEY` asks whether
  it ran), step by step as the local engine commits a step: the step's replays (each
  drawn item's mean score over the sessions that played it), then its pushes (the ok
  sessions of the run stores the phase's agents wrote under RUNS, as `--resume` reads
  them: engine/resume.py's bookkeeping; in the order of the phase's prompts, whatever
  order OpenRLHF played them in), with evictions as ReplayBuffer makes them. The events
  go to the job's run store JOB/runs/buffers/ (its `buffer_events`, with the local
  step and phase: `askspec query JOB/runs/buffers` shows them as a local run's), then
  the buffers' state to JOB/buffers/state.json (ReplayBuffer.state(), as the local
  trainer's checkpoints/buffers/step-N.json, and the phase's diversity()/novelty() calls
  after the earlier phases', in session order: `prompts` writes them to PHASE/history.json,
  which the phase's agents replay, as the local run keeps one history for the whole run),
  naming KEY: the commit point. A KEY
  already committed is skipped, so a re-run never commits twice; a commit killed before
  the state named it runs again and its events supersede the killed one's (the store's
  writer generation, per step, as a resumed local run's).

Only evictions that do not depend on a replay's score can be drawn ahead of a phase
(check.py refuses the others with E605)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from askspec.ir import model as ir
from askspec.lang.paths import MAX_DATA_BYTES, MAX_STATE_BYTES, FileRefused, read_regular

from askspec.runtime.engine.plan import bind
from askspec.runtime.engine.resume import json_cell
from askspec.runtime.engine.state import SessionBook
from askspec.runtime.scoring.buffers import ReplayBuffer
from askspec.runtime.store.layout import write_json_atomic
from askspec.runtime.targets.openrlhf.jobfile import JobFileError, PhaseJob, read_phase_job
from askspec.runtime.train.planner import Draw, step_elements

STATE = Path("buffers") / "state.json"
STORE = Path("runs") / "buffers"  # the run store of the job's buffer events
PLAN = "replays.json"  # in a replaying phase's folder: the item ids of each step, as `prompts` drew them
ELEMENTS = "elements.jsonl"  # in a pushing phase's folder: every element of its games, in plan order
# in a replaying phase's folder: launch.sh's extra flags when the buffer holds fewer items than a step
# replays (the step's prompts and rollouts, so that one OpenRLHF step is still one local step); else empty
LAUNCH_ARGS = "launch.args"
# in a drawn phase's folder: the diversity()/novelty() calls of every phase committed before it, in the local
# run's session order (the state's `stateful`), which the phase's agents replay into their histories (adapter.py)
HISTORY = "history.json"


class PhaseDataError(Exception):
    """The buffers cannot be read or written (one line for the user, no traceback)."""


def _read(path: Path, limit: int | None = None) -> str:
    """The text of one of the job's files: a regular file of at most `limit` bytes
    (MAX_STATE_BYTES unless given; read_regular), else a PhaseDataError naming it (and
    the limit)."""
    try:
        return read_regular(path, MAX_STATE_BYTES if limit is None else limit).decode("utf-8")
    except FileRefused as e:
        raise PhaseDataError(str(e)) from None
    except UnicodeDecodeError as e:
        raise PhaseDataError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason})") from None


def _read_json(path: Path) -> Any:
    text = _read(path)
    try:
        return json.loads(text)
    except RecursionError:
        raise PhaseDataError(f"{path} is not valid JSON (nested too deeply)") from None
    except ValueError as e:
        raise PhaseDataError(f"{path} is not valid JSON: {e}") from None


def _job(phase_dir: Path) -> tuple[PhaseJob, ir.Experiment]:
    try:
        job = read_phase_job(phase_dir)
    except JobFileError as e:
        raise PhaseDataError(str(e)) from None
    return job, job.ir()


def _state(job_root: Path) -> dict:
    """The buffers' state as the last commit left it (empty before the first), checked
    for its shape: a garbled file is a PhaseDataError, never a traceback later."""
    path = job_root / STATE
    if not path.exists():
        return {"buffers": {}, "committed": []}
    state = _read_json(path)
    why = None
    if not isinstance(state, dict):
        why = "not an object"
    elif not isinstance(state.get("committed"), list) or not all(isinstance(k, str) for k in state["committed"]):
        why = "its `committed` is not a list of keys"
    elif not isinstance(state.get("buffers"), dict):
        why = "its `buffers` is not an object"
    else:
        why = next((f"buffer {name!r}: {bad}" for name, b in state["buffers"].items()
                    if (bad := _buffer_state_problem(b)) is not None), None)
    if why is not None:
        raise PhaseDataError(f"{path} is not the job's buffer state ({why}): restore it, or remove it and the "
                             f"job's runs/buffers to start the buffers empty")
    return state


def _buffer_state_problem(b: Any) -> str | None:
    """What keeps `b` from being a ReplayBuffer.state() (None when it is one)."""
    if not isinstance(b, dict):
        return "not an object"
    for key, kind in (("items", list), ("ids", list), ("next_id", int), ("cursor", int), ("stats", dict)):
        if not isinstance(b.get(key), kind) or isinstance(b.get(key), bool):
            what = "a list" if kind is list else "an object" if kind is dict else "an integer"
            return f"`{key}` is missing or not {what}"
    if len(b["items"]) != len(b["ids"]) or not all(isinstance(i, int) and not isinstance(i, bool) for i in b["ids"]):
        return "`ids` is not one integer per item"
    if not all(isinstance(v, dict) and str(k).lstrip("-").isdigit() for k, v in b["stats"].items()):
        return "`stats` is not an object of item ids"
    return None


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


def phase_steps(exp: ir.Experiment, role: str, iteration: int) -> list[int]:
    """The local schedule's global step numbers of `role`'s phase in `iteration` (what a
    local run records as the steps of that phase's buffer events)."""
    return [s.step for s in _slots(exp, role, iteration)]


def _slots(exp: ir.Experiment, role: str, iteration: int) -> list:
    from askspec.runtime.train import schedule

    return [s for s in schedule.slots(exp)
            if s.phase.kind == "play" and s.iteration == iteration and role in s.phase.roles]


def _phase(exp: ir.Experiment, role: str) -> ir.TrainPhase:
    """The lowered phase that plays `role`'s steps (its sizes)."""
    return next(ph for ph in exp.train_phases() if ph.kind == "play" and role in ph.roles)


def _plain_batches(exp: ir.Experiment, role: str, elements: list[dict], steps: int,
                   iteration: int) -> list[list[tuple[dict, Draw]]]:
    """The elements of the `steps` steps of `role`'s phase in `iteration`, each with its
    draw: the local StepPlanner's walk (train.planner.step_elements), continuing over the
    role's earlier phases: each step takes elements in plan order, cycling, until its
    sessions (each element's group) reach the phase's `batch` (both the lowered phase's)."""
    if not elements:
        return []
    phase = _phase(exp, role)
    sizes = [phase.groups[json.loads(e["label"])["game"]] for e in elements]
    global_steps = phase_steps(exp, role, iteration)
    pos, out = 0, []
    for n in range((iteration - 1) * steps + steps):
        count = step_elements(sizes, pos, phase.batch)
        if n >= (iteration - 1) * steps:
            step = global_steps[n - (iteration - 1) * steps]
            out.append([(elements[(pos + j) % len(elements)], Draw("train", step, j, (pos + j) // len(elements)))
                        for j in range(count)])
        pos += count
    return out


def prompts(job_root: Path, phase_dir: Path, iteration: int = 1) -> int:
    """Write a drawn phase's prompts.jsonl (and a replaying phase's replays.json); the
    number of prompts (0 when the buffer is empty, or the phase is not drawn)."""
    from askspec.runtime.targets.openrlhf.generate import prompt_line, with_draw

    job, exp = _job(phase_dir)
    role = job.trained_role
    replay, draw = job.replay, job.draw
    if (replay or draw) and not phase_steps(exp, role, iteration):
        raise PhaseDataError(f"iteration {iteration} is past the spec's schedule, whose steps the phase's prompts "
                             f"are drawn for: set the schedule's `iterations` (a param with --set) and compile again, "
                             f"rather than ITERATIONS")
    lines, plan = [], []
    if replay:
        game = next(g for g in exp.games if g.name == replay["game"])
        buf = _buffers(exp, _state(job_root), None)[replay["buffer"]]
        batches = _draw(buf, int(replay["steps"]), int(replay["items"]))
        for step, batch in zip(phase_steps(exp, role, iteration), batches):
            plan.append([item_id for item_id, _ in batch])
            for j, (item_id, item) in enumerate(batch):
                lines.append(prompt_line(game.name, item_id, bind(game, item), Draw("replay", step, j)))
    elif draw:
        elements = [json.loads(x) for x in _read(phase_dir / ELEMENTS, MAX_DATA_BYTES).splitlines()]
        for taken in _plain_batches(exp, role, elements, int(draw["steps"]), iteration):
            lines += [with_draw(e, d) for e, d in taken]
    else:
        return 0
    write_json_atomic(phase_dir / HISTORY, history(_state(job_root)))
    # an empty buffer leaves an empty data set: driver.sh skips the phase, as a local step
    # with nothing to replay plays no session
    (phase_dir / "prompts.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                                             encoding="utf-8")
    if replay:
        write_json_atomic(phase_dir / PLAN, plan)
        # next_batch returns min(items, len(buffer)) items every step (nothing is pushed while they are drawn)
        short = plan and len(plan[0]) < int(replay["items"])
        args = f"--rollout.batch_size {len(plan[0])} --train.batch_size {len(plan[0]) * job.group}\n" \
            if short else ""
        (phase_dir / LAUNCH_ARGS).write_text(args, encoding="utf-8")
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


def _prompt_order(phase_dir: Path, job: PhaseJob, sessions: list) -> list[tuple[int | None, tuple]]:
    """`sessions` in the order of the phase's prompts.jsonl, as the local schedule plays
    its elements, whatever order OpenRLHF's rollout processes ran them in and however
    many of them recorded them, each with the local step
    its prompt belongs to (its draw's; None for a line without one): the k-th
    session of a prompt belongs to that prompt's (k // sessions per prompt)-th occurrence
    in the data set (a prompt drawn for two steps is played by both); a prompt's sessions
    keep the order they started in."""
    places: dict[tuple[str, str], list[tuple[int, int | None]]] = {}  # prompt -> its (position, step)s
    for pos, line in enumerate(_read(phase_dir / "prompts.jsonl", MAX_DATA_BYTES).splitlines()):
        label = json.loads(json.loads(line)["label"])
        draw = Draw.from_label(label.get("draw"))
        places.setdefault((label["game"], _key(label.get("bindings") or {})), []).append(
            (pos, draw.step if draw is not None else None))
    siblings = job.siblings
    seen: dict[tuple[str, str], int] = {}
    keyed = []
    for n, row in enumerate(sessions):
        k = (row[4], _key(row[0]))
        per_prompt = 1 if row[4] in siblings else max(1, job.group)
        count = seen[k] = seen.get(k, 0) + 1
        at = places.get(k) or [(len(places), None)]
        occurrence = (count - 1) // per_prompt
        pos, step = at[occurrence % len(at)]
        keyed.append(((occurrence // len(at), pos, n), step, row))
    return [(step, row) for _, step, row in sorted(keyed, key=lambda x: x[0])]


def _missing(phase_dir: Path, job: PhaseJob, sessions: list) -> list[str]:
    """The phase's prompts whose sessions are not all in `sessions` (a prompt listed k
    times in prompts.jsonl is played k times, each by its group's sessions, or by one
    session whose `sample N ask` replies are the group), each as `game #element bindings
    (found of expected sessions)`. A session counts whatever its status: a failed one
    reached the store too."""
    wanted: dict[tuple[str, str], tuple[int, str]] = {}
    siblings = job.siblings
    for line in _read(phase_dir / "prompts.jsonl", MAX_DATA_BYTES).splitlines():
        row = json.loads(line)
        label = json.loads(row["label"])
        k = (label["game"], _key(label.get("bindings") or {}))
        per_prompt = 1 if label["game"] in siblings else max(1, job.group)
        wanted[k] = (wanted.get(k, (0, ""))[0] + per_prompt, str(row.get("prompt", k[0])))
    found: dict[tuple[str, str], int] = {}
    for bindings, _, _, _, game in sessions:
        found[game, _key(bindings)] = found.get((game, _key(bindings)), 0) + 1
    return [f"{shown} ({found.get(k, 0)} of {n} sessions)" for k, (n, shown) in wanted.items() if found.get(k, 0) < n]


# the most missing prompts a refused commit names
MAX_SHOWN = 5


def history(state: dict) -> list[list[Any]]:
    """The committed phases' diversity()/novelty() calls ([fn, site, text, kwargs]), in the
    order the local run makes them: phase by phase, its sessions in prompt order."""
    calls = state.get("stateful") or []
    if not isinstance(calls, list) or not all(isinstance(c, list) and len(c) == 4 for c in calls):
        raise PhaseDataError(f"the job's buffer state ({STATE}) has a garbled `stateful` history: restore it")
    return calls


def _key(bindings: dict) -> str:
    return json.dumps(bindings, sort_keys=True, ensure_ascii=False, default=str)


def commit(job_root: Path, phase_dir: Path, runs: Path, key: str, iteration: int) -> list[dict]:
    """Commit a finished phase's replays and pushes to the job's buffers; the new events."""
    state = _state(job_root)
    if key in state["committed"]:
        return []
    job, exp = _job(phase_dir)
    role = job.trained_role
    slots = _slots(exp, role, iteration)
    steps = [s.step for s in slots]
    phase = slots[0].phase.name if slots else role  # the local run's name: the role (alternating) or "online"
    events: list[dict] = []
    buffers = _buffers(exp, state, events)
    replay = job.replay
    score = next((b.score for b in exp.buffers if replay and b.name == replay["buffer"]), None)
    by_step: dict[int | None, list[tuple[str, Any]]] = {}  # a local step's pushes, in session order
    scores: dict[tuple[int | None, str], list[Any]] = {}  # (step, item's bindings) -> its sessions' scores
    sessions = _sessions(runs)
    missing = _missing(phase_dir, job, sessions)
    if missing:
        shown = "; ".join(missing[:MAX_SHOWN]) + (f"; and {len(missing) - MAX_SHOWN} more" if len(missing) > MAX_SHOWN
                                                   else "")
        raise PhaseDataError(f"{key}: the run stores under {runs} lack sessions of {len(missing)} of the phase's prompts "
                             f"({shown}); every rollout's session must reach them before the phase's replays and "
                             "pushes are committed (ASKSPEC_RUNS must be on storage every node of the job sees): "
                             "nothing was committed, run the phase again")
    calls: list[list[Any]] = []  # the phase's diversity()/novelty() calls, in session order (any status: made)
    for step, (bindings, status, book, v, _) in _prompt_order(phase_dir, job, sessions):
        calls += [[c.fn, c.site, c.text, c.kwargs] for c in book.stateful]
        if status != "ok":  # an errored session's pushes never entered a buffer (resume.py), nor its score
            continue
        by_step.setdefault(step, []).extend((name, value) for name, value in book.pushes if name in buffers)
        scores.setdefault((step, _key(bindings)), []).append(v.get(score) if score else None)
    replays: dict[int | None, list[tuple[ReplayBuffer, int, float | None]]] = {}
    if replay:
        game = next(g for g in exp.games if g.name == replay["game"])
        buf = buffers[replay["buffer"]]
        plan = _read_json(phase_dir / PLAN)
        batches = _draw(buf, int(replay["steps"]), int(replay["items"]))  # advances the cursor as the phase did
        if [[i for i, _ in b] for b in batches] != plan:
            raise PhaseDataError(f"{phase_dir / PLAN} does not match buffer '{buf.name}' as it stands: run the "
                                 f"phase again from `prompts` (driver.sh does)")
        for step, batch in zip(steps, batches):
            for item_id, item in batch:  # an item's score: the mean over the step's sessions that played it
                bindings = {game.pattern[0]: item} if len(game.pattern) == 1 else dict(zip(game.pattern, list(item)))
                got = scores.get((step, _key(bindings)), [])
                nums = [float(x) for x in got if isinstance(x, (int, float)) and not isinstance(x, bool)]
                replays.setdefault(step, []).append((buf, item_id, sum(nums) / len(nums) if nums else None))
    # step by step, as the engine ends a step: its replays, then its pushes
    numbered = sorted(s for s in {*replays, *by_step} if s is not None)
    for step in [*numbered, *([None] if None in by_step else [])]:
        mark = len(events)
        for buf, item_id, value in replays.get(step, []):
            buf.replayed(item_id, value)
        for name, value in by_step.get(step, []):
            buffers[name].add(value)
        for ev in events[mark:]:
            ev.update(step=step, phase=phase)  # None: a prompt set written at compile time names no local step
    # the phase's events first, then the state naming the key: the commit point
    if events:
        _record(job_root, job, exp, events)
    state = {"buffers": {name: b.state() for name, b in buffers.items()}, "committed": [*state["committed"], key],
             "stateful": [*history(state), *calls]}
    (job_root / STATE).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(job_root / STATE, state)
    return events


def _record(job_root: Path, job: PhaseJob, exp: ir.Experiment, events: list[dict]) -> None:
    """Append `events` to the job's buffer run store (created by the first commit)."""
    from askspec.runtime.store import layout
    from askspec.runtime.store.writer import RunWriter

    root = job_root / STORE
    found = layout.find_run_dirs(root) if root.exists() else []
    if found:
        writer = RunWriter.open_for_resume(found[0], argv=sys.argv)
    else:
        writer = RunWriter.create(root, experiment=exp.name, experiment_hash=job.experiment_hash,
                                  ir_json=json.dumps(job.experiment, ensure_ascii=False),
                                  spec_files=job.spec_files, seed=job.seed, roles={},
                                  params=exp.param_values(), planned_sessions=0, argv=sys.argv)
    try:
        for ev in events:
            writer.buffer_event(**ev)
        writer.finish("finished")
    except BaseException:
        writer.close()
        raise


def read_events(job_root: Path) -> list[dict]:
    """Every committed phase's buffer events, in the order they were committed (the
    store's `buffer_events` view: a re-committed phase's events once)."""
    from askspec.runtime.store.views import open_store

    if not (job_root / STORE).exists():
        return []
    con = open_store(job_root / STORE)
    cur = con.execute("SELECT buffer, event, item, value, reason, score, best, replays, step, phase "
                      "FROM buffer_events ORDER BY step, seq")
    names = [d[0] for d in cur.description]
    return [{**dict(zip(names, row)), "value": json_cell(row[3]) if row[3] is not None else None}
            for row in cur.fetchall()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m askspec.runtime.targets.openrlhf.phase_data",
                                 description="a job's buffers around its phases (driver.sh runs it)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts", help="write a drawn phase's prompt data set (from the buffer as it stands)")
    p.add_argument("job")
    p.add_argument("phase")
    p.add_argument("--iteration", type=int, default=1)
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
            n = prompts(job, job / a.phase, a.iteration)
            print(f"phase {a.phase}: {n} prompt(s) drawn", file=sys.stderr)
        else:
            events = commit(job, job / a.phase, Path(a.runs), a.key, a.iteration)
            print(f"phase {a.phase}: {len(events)} buffer event(s) committed", file=sys.stderr)
    except (PhaseDataError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
