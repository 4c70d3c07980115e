"""`askspec rescore RUN --spec NEW.ask [-o OUT]`: a recorded evaluation run's sessions played
again under a changed spec without calling the models that played them: rewards, routes,
outcomes and metrics are evaluated anew, over the recorded replies.

- **The protocol must be the one recorded** (`protocol_changes`): the games' steps other
  than `reward`, `outcome` and the assignments only they read (an `end`'s outcome label
  aside), the roles that play, their models, templates, data sets and buffers. A spec that changes any of them is refused with
  an E701 diagnostic per change, at the new spec's line, the recorded one as a note.
  Rewards, outcomes, routes, metrics, parameters, tournaments and pointwise judges may change.
- **Replies come from the recording** (`Recording`, `RecordedBackend`): a call is answered
  with the recorded reply to the same role's same call of the same session (a group
  judge's: a recorded reply of that role to the same prompt), once its prompt is checked to
  be the one recorded. A judge (a tournament's or pointwise judge's role) whose prompt
  changed (its template, or the replies it compares) is called on its model, as the source
  run bound it, and the command says so. Any other call the recording cannot answer
  (a parameter that changed what a role is sent, a `resample` route) fails its session,
  and the command ends with an error naming it.
- **Lineage**: the new run's manifest has `rescore` (the source run's id, folder and spec
  hash, the new spec's hash, replies replayed, judge calls made, and any calls the
  recording could not answer); it lands beside the source run (-o changes where), so the
  TUI's compare screen (`askspec tui`, space on both, `c`) shows them side by side, and
  the command prints each role's mean reward before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from askspec.ir import model as ir
from askspec.ir.canonical import _strip_spans, from_json
from askspec.ir.walk import bodies
from askspec.terminal import printable

from askspec.runtime.backends.base import Backend, BackendError, ChatRequest, ChatResult
from askspec.runtime.commands.options import EXIT_ERROR, RunOptions, UsageError
from askspec.runtime.store import layout

if TYPE_CHECKING:
    from askspec.runtime.commands.start import Started
    from askspec.runtime.store.writer import RunWriter

# the run options a rescore takes from its source run (how its models were bound, how many
# sessions it played); the rest (out, resume, log, quiet ...) are the rescore's own
_SOURCE_OPTIONS = ("backend", "models", "sessions", "replay", "max_tokens", "base_url", "served_models",
                   "endpoints", "concurrency", "profile", "eval_only", "stage", "weights", "data")


# ------------------------------------------------------------------ the protocol


@dataclass
class Change:
    """One difference of protocol: what changed, where in the new spec and in the recorded one."""

    what: str
    new: ir.Span | None
    old: ir.Span | None


def _plain(node: Any, leave_out: tuple[str, ...] = ()) -> Any:
    data = _strip_spans(node.model_dump(mode="json"))
    for key in leave_out:
        data.pop(key, None)
    return data


def _judge_roles(exp: ir.Experiment) -> set[str]:
    """Roles that only judge (a tournament's or pointwise judge's), never asked in a game."""
    asked = {r for g in exp.games for s in _all(g.body) if isinstance(s, ir.AskStep) for r in s.roles}
    return _contests(exp, "judge") - asked


def _contests(exp: ir.Experiment, attr: str) -> set[str]:
    """The judge roles (`judge`) or templates (`template`) of the spec's tournaments and pointwise judges."""
    return {t.judge if attr == "judge" else t.template for t in exp.tournaments} | \
        {j.judge if attr == "judge" else j.template for j in exp.judges}


def _all(steps: list[ir.Step]) -> list[ir.Step]:
    out = []
    for s in steps:
        out.append(s)
        for _, body in bodies(s):
            out += _all(body)
    return out


def _head(s: ir.Step) -> Any:
    """A step without its nested step lists (compared one by one) and, for `end`, without its
    outcome label (an outcome may change)."""
    leave = ("body", "orelse", "branches") + (("outcome",) if isinstance(s, ir.EndStep) else ())
    data = _plain(s, leave)
    if isinstance(s, ir.IfStep):
        data["conds"] = [_strip_spans(b.cond.model_dump(mode="json")) for b in s.branches]
    return data


def _describe(s: ir.Step) -> str:
    if isinstance(s, ir.AskStep):
        return f"the `ask {', '.join(s.roles)}` step"
    if isinstance(s, ir.AssignStep):
        return f"the assignment to `{s.name}`"
    return f"the `{s.kind}` step"


def _refs(data: Any, out: set[str]) -> set[str]:
    """The session variables an IR value (as plain data) reads."""
    if isinstance(data, dict):
        if data.get("kind") == "ref" and data.get("scope") == "var":
            out.add(data["name"])
        for v in data.values():
            _refs(v, out)
    elif isinstance(data, list):
        for v in data:
            _refs(v, out)
    return out


def _played_vars(exp: ir.Experiment, game: ir.Game) -> set[str]:
    """The variables what the models are sent or how the game goes depends on: read by an
    ask (its expressions and the templates it renders), a condition, a loop, a bind, a push or a
    drop, and, in turn, by the assignments to those. An assignment to any other variable only
    scores (`calibration = case outcome {...}`) and may change like a reward."""
    steps = _all(game.body)
    roles = {r.name: r for r in exp.roles}
    reads: set[str] = set()
    for s in steps:
        if isinstance(s, (ir.RewardStep, ir.OutcomeStep, ir.AssignStep)):
            continue
        _refs(_head(s), reads)
        if isinstance(s, ir.AskStep):
            keys = [s.template] + [k for r in s.roles if r in roles
                                   for k in (roles[r].prompt, roles[r].system, roles[r].recover.truncated,
                                             roles[r].recover.malformed)]
            for k in keys:
                if k is not None and k in exp.templates:
                    reads |= set(exp.templates[k].variables)
    assigns = [s for s in steps if isinstance(s, ir.AssignStep)]
    while True:  # the assignments the reads depend on, to a fixed point
        more = set().union(*(_refs(_plain(s.value), set()) for s in assigns if s.name in reads)) - reads
        if not more:
            return reads
        reads |= more


def _scoring(s: ir.Step, played: set[str]) -> bool:
    return isinstance(s, (ir.RewardStep, ir.OutcomeStep)) or (isinstance(s, ir.AssignStep) and s.name not in played)


def _steps(old: list[ir.Step], new: list[ir.Step], game: ir.Game, out: list[Change],
           played: tuple[set[str], set[str]]) -> None:
    a = [s for s in old if not _scoring(s, played[0])]
    b = [s for s in new if not _scoring(s, played[1])]
    for x, y in zip(a, b):
        if _head(x) != _head(y):
            out.append(Change(f"game '{game.name}': {_describe(y)} differs from the recorded one", y.span, x.span))
            continue
        for (_, bx), (_, by) in zip(bodies(x), bodies(y)):
            _steps(bx, by, game, out, played)
    for y in b[len(a):]:
        out.append(Change(f"game '{game.name}': {_describe(y)} is not in the recorded game", y.span, None))
    for x in a[len(b):]:
        out.append(Change(f"game '{game.name}': {_describe(x)} of the recorded game is gone", game.span, x.span))


def protocol_changes(old: ir.Experiment, new: ir.Experiment) -> list[Change]:
    """What `new` changes of the protocol `old` was played with (module docstring)."""
    out: list[Change] = []
    judges = _judge_roles(old) & _judge_roles(new)
    old_games = {g.name: g for g in old.games}
    for g in new.games:
        was = old_games.get(g.name)
        if was is None:
            out.append(Change(f"game '{g.name}' is not in the recorded spec", g.span, None))
            continue
        for attr in ("pattern", "iter", "times", "group_size"):
            x, y = getattr(was, attr), getattr(g, attr)
            if (_strip_spans(x.model_dump(mode="json")) if isinstance(x, ir.Node) else x) != \
                    (_strip_spans(y.model_dump(mode="json")) if isinstance(y, ir.Node) else y):
                out.append(Change(f"game '{g.name}': its {attr.replace('_', ' ')} differs from the recorded one",
                                  g.span, was.span))
        _steps(was.body, g.body, g, out, (_played_vars(old, was), _played_vars(new, g)))

    def named(kind: str, xs: list, ys: list, skip: set[str], leave: tuple[str, ...] = ()) -> None:
        before = {x.name: x for x in xs}
        for y in ys:
            if y.name in skip:
                continue
            x = before.get(y.name)
            if x is None:
                out.append(Change(f"{kind} '{y.name}' is not in the recorded spec", y.span, None))
                continue
            a, b = _plain(x, leave), _plain(y, leave)
            fields = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            if fields:  # (a changed prompt shows as its template's key: an inline template's is its hash)
                out.append(Change(f"{kind} '{y.name}' differs from the recorded one ({', '.join(fields)})",
                                  y.span, x.span))

    named("role", old.roles, new.roles, judges, ("trained",))
    judge_models = {r.model for r in new.roles if r.name in judges} - {r.model for r in new.roles if r.name not in judges}
    named("model", old.models, new.models, {m for m in judge_models if m})
    named("data set", old.datasets, new.datasets, set(), ("path",))
    named("buffer", old.buffers, new.buffers, set())
    judge_templates = _contests(new, "template")
    for key, t in new.templates.items():
        x = old.templates.get(key)
        if key.startswith("inline:"):  # named by its text's hash: the role or step using it differs
            continue
        if key not in judge_templates and (x is None or x.source != t.source):
            out.append(Change(f"template '{key}' differs from the recorded one" if x is not None else
                              f"template '{key}' is not in the recorded spec", t.span, x.span if x else None))
    return out


# ------------------------------------------------------------------ the recording


@dataclass
class Recorded:
    prompt: list[dict[str, Any]]
    text: str | None
    finish_reason: str | None
    tokens_in: int
    tokens_out: int
    latency_ms: float
    error: str | None


@dataclass
class Recording:
    """The source run's turns (each session's latest attempt), as a rescore looks them up."""

    calls: dict[tuple[int, str], list[Recorded]] = field(default_factory=dict)  # (session index, role) -> in order
    contests: dict[tuple[str, str], deque[Recorded]] = field(default_factory=dict)  # (role, prompt) -> replies
    contest_roles: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, run_dir: Path) -> Recording:
        from askspec.runtime.store.views import open_store

        con = open_store(run_dir)
        try:
            rows = con.execute(
                "SELECT s.index, t.session_id, t.role, t.prompt, t.text, t.finish_reason, t.tokens_in, t.tokens_out, "
                "t.latency_ms, t.error, t.group_id FROM turns t LEFT JOIN sessions s USING (run_id, session_id) "
                "ORDER BY t.session_id, t.turn_index").fetchall()
        finally:
            con.close()
        rec = cls()
        calls: dict[tuple[int, str], list[Recorded]] = defaultdict(list)
        contests: dict[tuple[str, str], deque[Recorded]] = defaultdict(deque)
        for index, _sid, role, prompt, text, finish, t_in, t_out, latency, error, group in rows:
            messages = json.loads(prompt) if isinstance(prompt, str) else (prompt or [])
            turn = Recorded(messages, text, finish, int(t_in or 0), int(t_out or 0), float(latency or 0.0), error)
            if group is not None:
                contests[(role, _key(messages))].append(turn)
                rec.contest_roles.add(role)
            elif index is not None:
                calls[(int(index), role)].append(turn)
        rec.calls, rec.contests = dict(calls), dict(contests)
        return rec


def _key(messages: Any) -> str:
    return json.dumps([dict(m) for m in messages], sort_keys=True, ensure_ascii=False)


class ProtocolDrift(BackendError):
    """A call the recording cannot answer, to a role that is not a judge."""


@dataclass
class Tally:
    replayed: int = 0
    judge_calls: dict[str, int] = field(default_factory=dict)  # role -> calls made on its model
    drift: list[str] = field(default_factory=list)


class RecordedBackend(Backend):
    """Answers a role's calls from the recording; a judge's changed call goes to `called`."""

    name = "recorded"

    def __init__(self, recording: Recording, judges: set[str], tally: Tally, called: Any) -> None:
        self.recording, self.judges, self.tally, self.called = recording, judges, tally, called

    def determinism(self, concurrency: int) -> dict[str, Any]:
        return {"level": "exact", "why": "replies are the recorded run's, by session, role and call number"}

    async def complete(self, request: ChatRequest) -> ChatResult:
        sent = [dict(m) for m in request.messages]
        mine = self.recording.calls.get((request.session_index, request.role), [])
        turn = mine[request.call_index] if request.call_index < len(mine) else None
        if turn is None or turn.prompt != sent:
            pool = self.recording.contests.get((request.role, _key(sent)))
            turn = pool.popleft() if pool else None
        if turn is not None:
            self.tally.replayed += 1
            if turn.error is not None and turn.text is None:
                raise BackendError(f"(recorded) {turn.error}")
            return ChatResult(text=turn.text or "", finish_reason=turn.finish_reason or "stop",  # type: ignore[arg-type]
                              tokens_in=turn.tokens_in, tokens_out=turn.tokens_out, latency_ms=turn.latency_ms)
        if request.role in self.judges:
            self.tally.judge_calls[request.role] = self.tally.judge_calls.get(request.role, 0) + 1
            return await self.called(request)
        what = (f"session {request.session_index}, role '{request.role}', call {request.call_index + 1}: "
                + ("the recorded run made no such call" if not mine or request.call_index >= len(mine) else
                   "the prompt differs from the recorded one"))
        if what not in self.tally.drift:
            self.tally.drift.append(what)
        raise ProtocolDrift(f"rescore cannot answer {what} (the recorded replies answer the recorded prompts only; "
                            f"a rescore calls no model but a judge)")


# ------------------------------------------------------------------ the command


def _source(run_dir: Path) -> tuple[dict, ir.Experiment]:
    if not layout.is_run_dir(run_dir):
        raise UsageError(f"{run_dir} is not a run directory (no manifest.json)")
    manifest = json.loads(layout.manifest_path(run_dir).read_text(encoding="utf-8"))
    opts = manifest.get("run_options") or {}
    if manifest.get("training") and not opts.get("eval_only"):
        raise UsageError(f"{run_dir} is a training run: its sessions were played by weights that changed step "
                         f"by step; rescore re-scores evaluation runs (askspec run --eval-only)")
    if manifest.get("status") != "finished":
        raise UsageError(f"{run_dir} is {manifest.get('status')!r}, not finished: its unplayed sessions have no "
                         f"recorded replies (askspec run --resume {run_dir} first)")
    try:
        old = from_json((run_dir / "ir.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read the recorded spec {run_dir / 'ir.json'}: {e}") from None
    return manifest, old


def _options(spec: str, manifest: dict, out: str, quiet: bool) -> RunOptions:
    saved = manifest.get("run_options") or {}
    known = {f.name for f in dataclasses.fields(RunOptions)}
    kwargs: dict[str, Any] = {k: saved[k] for k in _SOURCE_OPTIONS if saved.get(k) is not None and k in known}
    kwargs.update(out=out, quiet=quiet, seed=manifest.get("seed"),
                  set={k: json.dumps(v) if not isinstance(v, str) else v
                       for k, v in (manifest.get("overrides") or {}).items()})
    return RunOptions.from_kwargs(spec, **kwargs)


def _refuse(changes: list[Change], run_dir: Path, res: Any) -> int:
    from askspec.diagnostics import DiagnosticSink

    from askspec.span import Span

    def span(s: ir.Span | None) -> Span | None:
        return Span(s.file, s.line, s.col, s.end_line, s.end_col) if s is not None else None

    sink = DiagnosticSink()
    for c in changes:
        d = sink.error("E701", f"{c.what}: rescore replays {run_dir.name}'s recorded replies, so the protocol "
                               f"that produced them must stay as it was", span(c.new))
        old = span(c.old)
        if old is not None:
            d.notes.append(("the recorded one (the spec the run was played with)", old))
    sink.emit(res.sources)
    print(printable(f"error: rescore refused: the spec changes {len(changes)} part(s) of the protocol "
                    f"{run_dir.name} was played with; only rewards, outcomes, routes, metrics, parameters, "
                    f"tournaments and judges may change", single_line=True), file=sys.stderr)
    return EXIT_ERROR


async def rescore(run_dir: str | os.PathLike[str], spec: str, out: str | None = None,
                  quiet: bool = True) -> tuple[int, str | None]:
    """The command as a function: (exit code, the new run's directory)."""
    from askspec.runtime.commands.resolver import ModelResolver
    from askspec.runtime.commands.run import Run
    from askspec.runtime.commands.start import compile_spec

    source = Path(run_dir).resolve()
    try:
        manifest, old = _source(source)
        opts = _options(spec, manifest, out or str(source.parent), quiet)
    except UsageError as e:
        print(printable(f"error: {e}", single_line=True), file=sys.stderr)
        return EXIT_ERROR, None
    res, new_hash = compile_spec(opts, None)  # as `askspec run` compiles it (diagnostics printed)
    if res is None or res.ir is None:
        return EXIT_ERROR, None
    changes = protocol_changes(old, res.ir)
    if changes:
        return _refuse(changes, source, res), None
    recording = Recording.read(source)
    judges = _contests(res.ir, "judge") | recording.contest_roles
    # the run binds every role to the replay backend (nothing loads, nothing is called); the
    # judges' own models, bound as the source run bound them, answer what changed
    replay_file = _empty_recording()
    recording_opts = dataclasses.replace(opts, backend=None, replay=os.fspath(replay_file))
    real = ModelResolver(res.ir, opts, os.path.dirname(os.path.abspath(spec)))
    tally = Tally()
    run = Run(recording_opts)
    source_hash = manifest.get("experiment_hash")

    def on_started(started: Started) -> None:
        resolve = started.resolver.resolve

        def wrapped(role: str, name: str | None) -> Any:
            binding = resolve(role, name)

            async def call(request: ChatRequest) -> ChatResult:
                return await real.resolve(role, name).backend.complete(request)

            label = binding.label
            return dataclasses.replace(binding, backend=RecordedBackend(recording, judges, tally, call), label=label)

        started.resolver.resolve = wrapped  # type: ignore[method-assign]
        started.writer.annotate(rescore=lineage())

    def lineage() -> dict[str, Any]:
        return {"source_run": manifest.get("run_id"), "source_dir": os.fspath(source), "source_hash": source_hash,
                "spec_hash": new_hash, "replayed": tally.replayed, "judge_calls": dict(tally.judge_calls),
                "unanswered": list(tally.drift)}

    def on_finish(writer: RunWriter, status: str) -> None:
        writer.annotate(rescore=lineage())

    run.on_started, run.on_finish = on_started, on_finish
    try:
        rc = await run.execute()
    finally:
        await real.aclose()
        replay_file.unlink(missing_ok=True)
    for role, n in sorted(tally.judge_calls.items()):
        print(f"note: judge '{role}' was called {n} time(s): its inputs changed (its template, or what it "
              f"compares), so the recorded verdicts did not apply", file=sys.stderr)
    if run.run_dir is not None and not quiet:
        for line in side_by_side(source, Path(run.run_dir)):
            print(line, file=sys.stderr)
    if tally.drift:
        print(printable(f"error: the recording could not answer {len(tally.drift)} call(s) under the new spec, "
                        f"first: {tally.drift[0]}; those sessions ended in error (a parameter that changes what a "
                        f"role is sent, or a `resample` route, needs new replies: askspec run)", single_line=True),
              file=sys.stderr)
        return EXIT_ERROR, run.run_dir
    return rc, run.run_dir


def _empty_recording() -> Path:
    """The replay backend needs a recording to be made; the replies come from RecordedBackend."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix=".rescore-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"sessions": []}, f)
    return Path(name)


def side_by_side(a: Path, b: Path) -> list[str]:
    """Each role's mean reward (as the trainer uses it) and the outcomes, in both runs."""
    from askspec.runtime.commands.inspect_log import session_finals
    from askspec.runtime.store.views import open_store

    def summary(run_dir: Path) -> tuple[dict[str, float], dict[str, int]]:
        con = open_store(run_dir)
        try:
            cur = con.execute("SELECT * FROM rewards")
            names = [d[0] for d in cur.description]
            rewards = [dict(zip(names, r)) for r in cur.fetchall()]
            cur = con.execute("SELECT * FROM groups")
            names = [d[0] for d in cur.description]
            groups = {g["group_id"]: g for g in (dict(zip(names, r)) for r in cur.fetchall())}
            sessions = con.execute("SELECT session_id, group_id, outcome FROM sessions WHERE status = 'ok'").fetchall()
        finally:
            con.close()
        by_session: dict[str, list[dict]] = defaultdict(list)
        for r in rewards:
            by_session[r["session_id"]].append(r)
        totals: dict[str, list[float]] = defaultdict(list)
        outcomes: dict[str, int] = defaultdict(int)
        for sid, gid, outcome in sessions:
            for role, v in session_finals(by_session.get(sid, []), groups.get(gid))[0].items():
                totals[role].append(v)
            if outcome is not None:
                outcomes[str(outcome)] += 1
        return {r: sum(v) / len(v) for r, v in totals.items()}, dict(outcomes)

    (ra, oa), (rb, ob) = summary(a), summary(b)
    rows = [("", a.name, b.name)]
    rows += [(f"mean reward {r}", f"{ra[r]:.4g}" if r in ra else "-", f"{rb[r]:.4g}" if r in rb else "-")
             for r in sorted(set(ra) | set(rb))]
    rows += [(f"outcome {o}", str(oa.get(o, 0)), str(ob.get(o, 0))) for o in sorted(set(oa) | set(ob))]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return [printable(f"{x:<{w[0]}}  {y:>{w[1]}}  {z:>{w[2]}}", single_line=True) for x, y, z in rows]


def cmd_rescore(args: argparse.Namespace) -> int:
    rc, _ = asyncio.run(rescore(args.run_dir, args.spec, args.output, quiet=args.quiet))
    return rc


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rescore", help="re-score a recorded run's sessions under a changed spec, without its models",
                       description="Play a recorded evaluation run's sessions again under a changed spec: the "
                                   "recorded replies answer every call (a judge whose inputs changed is called), "
                                   "so rewards, routes, outcomes and metrics are evaluated anew. A spec that "
                                   "changes the protocol (the steps that made the replies) is refused.")
    p.add_argument("run_dir", metavar="RUN", help="the recorded run directory")
    p.add_argument("--spec", required=True, metavar="NEW.ask", help="the changed spec")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="folder for the new run directory (default: the source run's folder)")
    p.add_argument("--quiet", action="store_true", help="no progress display or side-by-side summary")
    p.set_defaults(func=cmd_rescore)
