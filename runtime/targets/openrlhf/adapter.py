"""The runtime behind a generated OpenRLHF agent (`agent.py` in a job folder): one rollout
is one session of the compiled game, played by askspec's own engine.

OpenRLHF 0.11.2 calls `AgentExecutor.execute(prompt, label, ...)` once per sample; the
label names the game element (`{"game", "element", "bindings"}`). The agent plans a
session for it, attaches a token-recording Conversation (tokens.py) for the trained role,
and lets `Engine.run_session` play it: frozen roles go to their OpenAI-compatible
endpoints, the trained role to OpenRLHF's vLLM engine. The reward is the training
contract of runtime/scoring/trajectory.py.

Groups. OpenRLHF's rollout actor runs the N samples of one prompt concurrently on one
executor (`RolloutRayActor.generate_responses` gathers N `execute` calls that share their
arguments), so the agent sees the group: the N sessions meet in a `_Group`, the last one
to finish runs the game's routes (`Engine.route_group`: keep, drop, a pointwise judge or
a tournament against the judge's endpoint), and every member returns its routed reward.
A group is keyed by the identity of the call's shared `sampling_params` and the prompt,
so concurrent calls for the same prompt never mix. Rollouts of one prompt that do not
run together (a caller awaiting `execute` one at a time) are routed as the smaller
group they form, with a warning, rather than waiting forever.

Siblings. In a game whose group is the N replies of the trained role's `sample N ask`
(job.json's `siblings`, check.py), the N rollouts of a prompt are one session: the first
`execute` plans it and starts it, the others join it, and its `sample N ask` sends reply
i to rollout i's Conversation (the call's `sample_key`). The rest of the session — the
frozen roles' turns that use all N replies, rewards, drops — runs once, and each rollout
returns its own reply's reward and action ranges. A session that fails (a generate call
that raises, a frozen endpoint that gives up) or runs past `$ASKSPEC_GROUP_TIMEOUT`
seconds (default 1800; it is cancelled) is recorded as an error session in the run
store, and every rollout of it returns reward 0 with no action range (no loss). The
timeout bounds every session, so a group's members never wait forever either: a member
past it is an error session, and the group is routed without it.

Datasets (a nested schedule's outer role, SOAR's teacher). A session that samples K
datasets (`repeat k in 1..K { xs = sample N ask ROLE }`) is one prompt of K x N
rollouts: reply i of the k-th call is rollout k·N + i, and the group is all of them, as
the local schedule groups an outer session. Under `outer_reward = grounded` the session's
datasets (nested.datasets_of, the local schedule's own) go to the job's inner-loop
service once the session has ended (inner_loop.py: it trains the inner role's copies and
answers R_k per dataset); every reply of dataset k gets the turn reward `grounded` = R_k,
recorded in the agent's run store as the local schedule records it. A service that fails,
or has not answered within `$ASKSPEC_INNER_TIMEOUT` seconds (default a day: an outer step
trains K x copies students), leaves the session's rollouts without reward or loss
(logged; `askspec_inner_loop_ok` 0).

Every session is recorded in a run directory per rollout process (`$ASKSPEC_RUNS`, else
`runs/` in the job folder), queryable with `askspec query` like any run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from askspec.ir import model as ir

from askspec.runtime.backends.base import BackendError
from askspec.runtime.backends.registry import make_backend
from askspec.runtime.engine.plan import SessionPlan, derive_seed, load_dataset
from askspec.runtime.engine.session import Engine, ModelBinding, SessionFailed, SessionResult, recordable
from askspec.runtime.engine.stateful import SharedHistory, StatefulScorers
from askspec.runtime.scoring.trajectory import trained_turns, trajectory_return
from askspec.runtime.targets.openrlhf.tokens import Conversation, OpenRLHFBackend, Siblings
from askspec.runtime.targets.openrlhf.jobfile import FILE as JOB_FILE, InnerLoop, PhaseJob, read_phase_job
from askspec.runtime.train.planner import Draw

log = logging.getLogger(__name__)

HOST_ENV = "ASKSPEC_FROZEN_HOST"  # where the frozen roles' servers listen (default 127.0.0.1)
TIMEOUT_ENV = "ASKSPEC_GROUP_TIMEOUT"  # seconds a session of siblings may run (docs/cluster.md)
HISTORY_ENV = "ASKSPEC_HISTORY"  # the diversity()/novelty() history file the job's agents share (launch.sh)
LAUNCH_ENV = "ASKSPEC_LAUNCH"  # this launch of a phase, which tags its lines of that file (launch.sh)
DEFAULT_TIMEOUT = 1800.0
GROUNDED = "grounded"  # the turn reward the inner loop's R_k is recorded as (runtime/train/nested.py)
INNER_TIMEOUT_ENV = "ASKSPEC_INNER_TIMEOUT"  # seconds an outer session waits for the inner loop's answer
DEFAULT_INNER_TIMEOUT = 86400.0


class _Recorder:
    """The engine's Recorder inside the agent (runtime/engine/recorder.py): forwards every
    event to the run store and keeps what the agent returns to OpenRLHF — the trained
    role's turn indexes per session (in call order, i.e. action-range order), and the
    scores a route wrote after the session ended (a tournament's or judge's, which replace
    the session's rewards)."""

    def __init__(self, writer: Any, role: str) -> None:
        self.writer = writer
        self.role = role
        self.turns: dict[str, list[int]] = {}
        self.finished: set[str] = set()
        self.routed: dict[str, float] = {}
        self.routes: dict[str, str] = {}
        self.attempts: dict[str, int] = {}
        self.totals: dict[str, dict[str, float]] = {}  # session -> role -> its rewards' sum (an update gate's)
        # session -> (k-th `sample` call of the role, reply i) -> turns
        self.samples: dict[str, dict[tuple[int, int], list[int]]] = {}
        self.asks: dict[str, list[str]] = {}  # session -> the role's `sample` calls ("x{ask}"), in order
        self.rollouts: dict[str, list[dict]] = {}  # session -> the role's turns with their sample keys
        self.parsed: dict[tuple[str, int], Any] = {}  # (session, turn) -> the role's reply fields (as StepLog.parsed)

    def session_started(self, session_id: str, **kw: Any) -> int:
        attempt = self.attempts[session_id] = self.writer.session_started(session_id, **kw)
        return attempt

    def rollout(self, plan: SessionPlan, attempt: int, turn_index: int, role: str, result: Any, temperature: float,
                sample_key: str | None) -> None:
        """The engine's on_rollout: which reply of which `sample N ask` call each turn of the role extends."""
        if role == self.role and sample_key is not None:
            ask, _, i = sample_key.rpartition(".")
            asks = self.asks.setdefault(plan.session_id, [])
            if ask not in asks:
                asks.append(ask)
            self.samples.setdefault(plan.session_id, {}).setdefault((asks.index(ask), int(i)), []).append(turn_index)
            self.rollouts.setdefault(plan.session_id, []).append(
                {"role": role, "turn_index": turn_index, "sample_key": sample_key})

    def turn(self, session_id: str, attempt: int, **kw: Any) -> None:
        if kw.get("role") == self.role and kw.get("group_id") is None:  # not a group's judge call
            self.turns.setdefault(session_id, []).append(kw["turn_index"])
            if isinstance(kw.get("parsed"), dict):
                self.parsed[(session_id, int(kw["turn_index"]))] = {"text": kw.get("text"), **kw["parsed"]}
        self.writer.turn(session_id, attempt, **kw)

    def reward(self, session_id: str, attempt: int, **kw: Any) -> None:
        totals = self.totals.setdefault(session_id, {})
        totals[kw["role"]] = totals.get(kw["role"], 0.0) + float(kw["value"])
        if session_id in self.finished and kw.get("role") == self.role:
            self.routed[session_id] = float(kw["value"])
        self.writer.reward(session_id, attempt, **kw)

    def session_finished(self, session_id: str, attempt: int, **kw: Any) -> None:
        self.finished.add(session_id)
        self.writer.session_finished(session_id, attempt, **kw)

    def group(self, group_id: str, *, route: str, stats: dict, members: list[str], **kw: Any) -> None:
        if stats.get("role", self.role) == self.role:
            self.routes[group_id] = route
        self.writer.group(group_id, route=route, stats=stats, members=members, **kw)

    def forget(self, session_id: str) -> None:
        for table in (self.turns, self.routed, self.attempts, self.samples, self.asks, self.rollouts):
            table.pop(session_id, None)
        for key in [k for k in self.parsed if k[0] == session_id]:
            del self.parsed[key]
        self.finished.discard(session_id)
        self.totals.pop(session_id, None)

    # forwarded as they are (the engine's other events)
    def match(self, group_id: str, **kw: Any) -> None:
        self.writer.match(group_id, **kw)

    def buffer_event(self, **kw: Any) -> None:
        self.writer.buffer_event(**kw)


@dataclass
class _Group:
    """The N concurrent sessions of one prompt, routed together once all have finished."""

    group_id: str
    size: int
    draw: Draw | None = None
    round: int = 0
    joined: int = 0
    route: str = "none"  # the trained role's route, once the group is routed
    results: list[SessionResult] = field(default_factory=list)
    routed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Siblings:
    """The N rollouts of one prompt that are one session's `sample N ask` replies."""

    plan: SessionPlan
    members: list[Conversation]
    task: asyncio.Future  # the session: its SessionResult, or None when it timed out
    joined: int = 0
    returned: int = 0
    grounded: asyncio.Future | None = None  # the inner loop's rewards (turn -> R_k), asked once the session ended


def open_job_writer(exp: ir.Experiment, job: PhaseJob, job_dir: Path, role: str, program: str) -> Any:
    """A new run directory of one of the job's processes (`program`: the agent, the trainer)
    under $ASKSPEC_RUNS (default JOB/runs), `role` the trained one."""
    from askspec.ir.canonical import experiment_hash, to_json
    from askspec.runtime.store.writer import RunWriter

    out = os.environ.get("ASKSPEC_RUNS") or str(job_dir / "runs")
    roles = {r.name: {"model": r.model, "trained": r.name == role} for r in exp.roles}
    return RunWriter.create(out, experiment=exp.name, experiment_hash=experiment_hash(exp), ir_json=to_json(exp),
                            spec_files=job.spec_files, seed=job.seed, roles=roles,
                            params=exp.param_values(), planned_sessions=0,
                            argv=[program, str(job_dir), socket.gethostname(), str(os.getpid())])


def carried_history(phase_dir: Path, shared: str | None = None, launch: str = "") -> StatefulScorers:
    """The diversity()/novelty() histories a phase's agent starts from: the calls of every
    phase committed before it (PHASE/history.json, written by phase_data.py's `prompts`),
    replayed in the local run's order, as a local run keeps one history for the whole run
    (docs/cluster.md, "State across phases"). With `shared` (launch.sh's $ASKSPEC_HISTORY)
    the calls go to that file, which every agent of the job reads before it scores: one
    history for every engine, and, in a job without history.json (no buffer between its
    phases), for every phase (its lines of other launches too); with history.json only this
    launch's lines (`launch`, $ASKSPEC_LAUNCH), the earlier phases' being in history.json."""
    from askspec.runtime.targets.openrlhf.phase_data import HISTORY

    path = phase_dir / HISTORY
    scorers = SharedHistory(shared, launch, earlier_launches=not path.is_file()) if shared else StatefulScorers()
    if path.is_file():
        for fn, site, text, kwargs in json.loads(path.read_text(encoding="utf-8")):
            scorers.replay(fn, site, text, kwargs)
    return scorers


def _timeout(raw: str | None, name: str = TIMEOUT_ENV, default: float = DEFAULT_TIMEOUT,
             what: str = "a session of `sample N ask` siblings may run") -> float:
    """$ASKSPEC_GROUP_TIMEOUT (or `name`): seconds `what` (unset or empty: the default)."""
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name}={raw!r}: give the seconds {what}, a number > 0 (default {default:g})")
    return value


class GameAgent:
    """Plays one session per `execute`; shared by every rollout of a process."""

    def __init__(self, job_dir: str | os.PathLike[str]) -> None:
        self.job_dir = Path(job_dir)
        job = read_phase_job(self.job_dir)
        self.job = job
        self.exp = job.ir()
        self.role: str = job.trained_role
        self.group_size: int = job.group
        self.siblings: dict[str, int] = job.siblings
        self.sample_calls: dict[str, int] = job.sample_calls
        # a grounded nested schedule: its service's Ray actor name and the outer games
        self.inner_loop: InnerLoop | None = job.inner_loop
        self.service: Any = None  # the inner-loop service (inner_loop.connect), found on first use
        self.timeout = _timeout(os.environ.get(TIMEOUT_ENV))
        self.inner_timeout = _timeout(os.environ.get(INNER_TIMEOUT_ENV), INNER_TIMEOUT_ENV, DEFAULT_INNER_TIMEOUT,
                                      "an outer session waits for the inner-loop service's answer")
        # the names the trained role's update gate reads, when askspec_ext/gate.py evaluates one (update_gate.py)
        self.gate_names: set[str] | None = None
        if job.extension.get("update_gate"):
            from askspec.runtime.targets.openrlhf.update_gate import names

            self.gate_names = names(next(t.update_when for t in self.exp.training if t.role == self.role))
        self.seed: int = job.seed
        self.params = self.exp.param_values()
        spec_dir = str(self.job_dir / "spec")
        self.datasets = {d.name: load_dataset(d, spec_dir, self.seed) for d in self.exp.datasets}
        self.backend = OpenRLHFBackend()
        self._bindings: dict[tuple[str, str | None], ModelBinding] = {}
        self._engine: Engine | None = None
        self._recorder: _Recorder | None = None
        self._index = itertools.count()
        self._rounds: dict[tuple, int] = {}
        self._groups: dict[tuple, _Group] = {}
        self._sessions: dict[tuple, _Siblings] = {}

    # ------------------------------------------------------------------ wiring
    def resolve(self, role: str, name: str | None) -> ModelBinding:
        key = (role, name)
        if key not in self._bindings:
            self._bindings[key] = self._resolve(role, name)
        return self._bindings[key]

    def _resolve(self, role: str, name: str | None) -> ModelBinding:
        model = self.exp.model(name) if name else None
        sampling = dict(model.sampling) if model is not None else {}
        if role == self.role:
            return ModelBinding(name=name or role, backend=self.backend, weights=model.weights if model else "", sampling=sampling)
        endpoints = self.job.endpoints
        ep = endpoints.roles.get(role) or endpoints.models.get(name or "")
        if ep is None:
            raise SessionFailed(f"role '{role}': model '{name}' has no endpoint in {JOB_FILE}")
        options = dict(ep.options)
        host = os.environ.get(HOST_ENV, "127.0.0.1")
        if isinstance(options.get("base_url"), str):
            options["base_url"] = options["base_url"].replace("{host}", host)
        elif isinstance(options.get("base_url"), list):
            options["base_url"] = [u.replace("{host}", host) for u in options["base_url"]]
        if ep.backend == "replay" and not os.path.isabs(options.get("file", "/")):
            options["file"] = str(self.job_dir / options["file"])
        try:
            backend = make_backend(ep.backend, ep.weights, options)
        except BackendError as e:
            raise SessionFailed(str(e)) from None
        return ModelBinding(name=name or role, backend=backend, weights=ep.weights, sampling=sampling)

    def engine(self) -> Engine:
        if self._engine is None:
            self._recorder = _Recorder(self._open_writer(), self.role)
            history = carried_history(self.job_dir, os.environ.get(HISTORY_ENV), os.environ.get(LAUNCH_ENV, ""))
            self._engine = Engine(self.exp, params=self.params, datasets=self.datasets, writer=self._recorder,
                                  resolve_model=self.resolve, seed=self.seed, stateful=history,
                                  rollout_roles=frozenset({self.role}), on_rollout=self._recorder.rollout)
        return self._engine

    def _open_writer(self) -> Any:
        return open_job_writer(self.exp, self.job, self.job_dir, self.role, "openrlhf-agent")

    def close(self) -> None:
        """Flush and close the run directory (the job's agent module registers this to run at
        exit: a training job ends by stopping its processes, whose exit is the process's own
        business, not this library's)."""
        if self._recorder is not None:
            self._recorder.writer.close()

    # ------------------------------------------------------------------ one rollout
    async def execute(self, prompt: str, label: str, sampling_params: Any, max_length: int, hf_tokenizer: Any,
                      llm_engine: Any) -> dict[str, Any]:
        element = json.loads(label)
        engine = self.engine()
        recorder = self._recorder
        assert recorder is not None
        game = engine.games[element["game"]]
        if game.name in self.siblings:
            return await self._sibling(prompt, label, element, self.siblings[game.name], sampling_params, max_length,
                                       hf_tokenizer, llm_engine)
        size = self.group_size if self.group_size > 1 else 1
        key = (id(sampling_params), prompt, label)
        group = self._join(key, element, size)
        plan = self._plan(element, group.draw, group.round, group.joined - 1, size,
                          group.group_id if size > 1 else None)
        index = plan.index
        conv = Conversation(tokenizer=hf_tokenizer, engine=llm_engine, sampling_params=sampling_params,
                            max_length=max_length)
        self.backend.conversations[index] = conv
        if size > 1:
            await asyncio.sleep(0)  # siblings started in the same gather join before any session runs
        try:
            result = await self._run(plan)
        finally:
            self.backend.conversations.pop(index, None)
        if size > 1:
            group.results.append(result)
            partial = len(group.results) == group.joined < size
            if partial:  # every member that joined has finished and no sibling runs beside them
                if self._groups.get(key) is group:
                    del self._groups[key]
                log.warning("group %s: %d of %d samples ran concurrently; routing them alone (OpenRLHF runs a "
                            "prompt's samples together)", group.group_id, group.joined, size)
            if len(group.results) == size or partial:
                try:
                    await engine.route_group(group.group_id, sorted(group.results, key=lambda r: r.plan.index))
                finally:
                    group.route = recorder.routes.pop(group.group_id, "none")
                    group.routed.set()
            await group.routed.wait()
        try:
            return self._response(prompt, label, result, conv, recorder.turns.get(plan.session_id, []), False,
                                  recorder.routed.get(plan.session_id), group.route)
        finally:
            recorder.forget(plan.session_id)

    async def _sibling(self, prompt: str, label: str, element: dict, n: int, sampling_params: Any, max_length: int,
                       hf_tokenizer: Any, llm_engine: Any) -> dict[str, Any]:
        """Rollout i of a prompt: reply i of its session's `sample N ask` (module docstring)."""
        recorder = self._recorder
        assert recorder is not None
        key = (id(sampling_params), prompt, label)
        sib = self._sessions.get(key)
        if sib is None:
            game = element["game"]
            draw = Draw.from_label(element.get("draw"))
            plan = self._plan(element, draw, self._round(element, draw), 0, 1, None)
            index = plan.index
            members = [Conversation(tokenizer=hf_tokenizer, engine=llm_engine, sampling_params=sampling_params,
                                    max_length=max_length) for _ in range(n)]
            self.backend.conversations[index] = Siblings(members, calls=self.sample_calls.get(game, 1))
            sib = self._sessions[key] = _Siblings(plan, members, asyncio.ensure_future(self._play(plan)))
        member = sib.joined
        sib.joined += 1
        if sib.joined == n:
            del self._sessions[key]  # whole: the next call with this key starts a new session
        # shielded: one rollout cancelled by its caller leaves the session to the others
        result = await asyncio.shield(sib.task)
        if self._sessions.get(key) is sib:  # the session ended before all N rollouts joined it
            del self._sessions[key]
            log.warning("session %s: %d of %d rollouts of its prompt ran concurrently; the other replies of its "
                        "`sample %d ask` are not returned (OpenRLHF runs a prompt's rollouts together)",
                        sib.plan.session_id, sib.joined, n, n)
        sid = sib.plan.session_id
        extra: list[tuple[str, int | None, str, float]] = []
        logs: dict[str, float] = {}
        if self.inner_loop is not None and sib.plan.game in self.inner_loop.games:
            # every rollout of the job logs the same keys (OpenRLHF merges extra_logs key by key)
            logs["askspec_inner_loop_ok"] = 0.0
            if result.status == "ok":  # a failed session is not the inner loop's to train on
                if sib.grounded is None:
                    sib.grounded = asyncio.ensure_future(self._grounded(result))
                grounded = await asyncio.shield(sib.grounded)
                logs["askspec_inner_loop_ok"] = float(grounded is not None)
                if grounded is None:  # the service failed: no reward, no loss
                    result = dataclasses.replace(result, status="error")
                else:
                    extra = [(self.role, t, GROUNDED, v) for t, v in grounded.items()]
        try:
            per = n // self.sample_calls.get(sib.plan.game, 1)
            turns = recorder.samples.get(sid, {}).get(divmod(member, per), [])
            return self._response(prompt, label, result, sib.members[member], turns, True, None, "none", extra, logs)
        finally:
            sib.returned += 1
            if sib.returned == sib.joined and self._sessions.get(key) is not sib:
                recorder.forget(sid)

    async def _grounded(self, result: SessionResult) -> dict[int, float] | None:
        """The inner loop's R_k for a finished outer session, as turn -> reward for every
        reply of each dataset (the local schedule's InnerLoop.run), recorded as the turn
        reward `grounded`; None when the service failed (logged)."""
        from askspec.runtime.targets.openrlhf import inner_loop
        from askspec.runtime.train.batch import SessionRecord
        from askspec.runtime.train.nested import datasets_of

        recorder = self._recorder
        assert recorder is not None and self.inner_loop is not None
        sid = result.plan.session_id
        book = {"dropped": [{"role": d.role, "turns": d.turns} for d in result.book.dropped]}
        record = SessionRecord(sid, None, result.attempt, status=result.status, book=book,
                               rollouts=recorder.rollouts.get(sid, []))
        datasets = datasets_of([record], recorder.parsed, self.role)
        try:
            if self.service is None:
                self.service = inner_loop.connect(self.inner_loop.service)
            key = f"{socket.gethostname()}:{os.getpid()}:{sid}"
            answer = await asyncio.wait_for(self.service.answer(key, [d.items for d in datasets]), self.inner_timeout)
        except Exception as e:  # the rollouts return without loss rather than fail OpenRLHF's step (or wait forever)
            log.warning("session %s: the inner-loop service failed (%s: %s); its rollouts carry no loss",
                        sid, e.__class__.__name__, e)
            return None
        out: dict[int, float] = {}
        for ds, r_k in zip(datasets, answer["outer_rewards"]):
            for _sid, attempt, turn in ds.turns:
                recorder.writer.reward(sid, attempt, role=self.role, turn_index=turn, name=GROUNDED, value=r_k,
                                       kind="turn")
                out[turn] = float(r_k)
        return out

    async def _play(self, plan: SessionPlan) -> SessionResult:
        """Run a session of siblings (`_run`), then detach its rollouts from the backend."""
        try:
            return await self._run(plan)
        finally:
            self.backend.conversations.pop(plan.index, None)

    async def _run(self, plan: SessionPlan) -> SessionResult:
        """Run a session; past the timeout it is cancelled and recorded as an error session
        (its group goes on without it), so no rollout waits forever."""
        engine, recorder = self.engine(), self._recorder
        assert recorder is not None
        try:
            return await asyncio.wait_for(engine.run_session(plan), self.timeout)
        except asyncio.TimeoutError:
            error = f"the session ran past {self.timeout:g} s ({TIMEOUT_ENV}) and was cancelled; its rollouts carry no loss"
            log.warning("session %s: %s", plan.session_id, error)
            attempt = recorder.attempts.get(plan.session_id, 1)
            recorder.writer.session_finished(plan.session_id, attempt, status="error", outcome=None, error=error, vars={})
            return SessionResult(plan=plan, status="error", error=error, attempt=attempt)

    def _round(self, element: dict, draw: Draw | None) -> int:
        """How many groups (or sessions of siblings) of this element, at this draw, this
        process played before: a line played again (another episode over the prompts) is
        a group of its own."""
        key = (element["game"], int(element["element"]), draw)
        n = self._rounds.get(key, 0)
        self._rounds[key] = n + 1
        return n

    def _plan(self, element: dict, draw: Draw | None, round_: int, member: int, size: int,
              group_id: str | None) -> SessionPlan:
        """The session of `member` of a group of the prompt's element. A prompt line with a
        draw (the local planner's walk, written by generate.py and phase_data.py) is the
        local schedule's group, and its sessions are the trainer's: Draw.sessions, the seeds
        a local run plays that group under. A line without one (a nested or a `batch`-less
        phase's, whose steps are not a local step's) plays the k-th group of an element as
        repeat k of `askspec run`'s plan: the same seeds (plan.py)."""
        index = next(self._index)
        game, item = element["game"], int(element["element"])
        bindings = dict(element.get("bindings") or {})
        if draw is None:
            return SessionPlan(index=index, session_id=f"s{index:06d}", game=game, group_id=group_id, group_size=size,
                               bindings=bindings, seed=derive_seed(self.seed, game, item, round_, member))
        (plan,) = draw.sessions(self.seed, game, item, bindings, size, index, members=range(member, member + 1))
        if round_:  # the line played again: fresh seeds
            plan = dataclasses.replace(plan, seed=derive_seed(plan.seed, "again", round_))
        return dataclasses.replace(plan, group_id=group_id)

    def _join(self, key: tuple, element: dict, size: int) -> _Group:
        group = self._groups.get(key)
        if group is None or group.joined >= size:
            game, index = element["game"], int(element["element"])
            draw = Draw.from_label(element.get("draw"))
            n = self._round(element, draw)
            if draw is None:
                group_id = f"{game}-g{index:05d}-r{n:03d}"
            else:  # the local schedule's group id (a line played again: one of its own); none for a group of one
                group_id = (draw.group_id(game, size) or "") + (f"-x{n}" if n else "")
            group = self._groups[key] = _Group(group_id=group_id, size=size, draw=draw, round=n)
        group.joined += 1
        if group.joined == size:
            self._groups.pop(key, None)  # full: the next call with this key starts a new group
        return group

    def _label(self, label: str, result: SessionResult) -> str:
        """The label a rollout returns: the prompt's, with its session as the job's update
        gate sees it when there is one (update_gate.py)."""
        recorder = self._recorder
        if self.gate_names is None or recorder is None:
            return label
        from askspec.runtime.targets.openrlhf.update_gate import labelled, session_fields

        plan = result.plan
        scalars = {k: v for k, v in result.vars.items() if recordable(v)}  # the vars the run store records
        return labelled(label, session_fields(f"{recorder.writer.run_id}/{plan.session_id}", plan.game, result.status,
                                              result.outcome, scalars, plan.bindings,
                                              recorder.totals.get(plan.session_id, {}), self.gate_names))

    def _response(self, prompt: str, label: str, result: SessionResult, conv: Conversation,
                  turns: list[int], sample: bool, routed: float | None, route: str,
                  extra: list[tuple[str, int | None, str, float]] | None = None,
                  logs: dict[str, float] | None = None) -> dict[str, Any]:
        """What OpenRLHF gets for one rollout: `turns` are its trajectory's turn indexes (in
        call order), every turn of the role in the session unless it is one reply of a
        `sample` (`sample`); `routed` the score a route gave it; `extra` reward rows written
        after the session ended (the inner loop's)."""
        reward = trajectory_return([*result.rewards, *(extra or [])], self.role, turns if sample else None, routed)
        keep = trained_turns(turns, self.role, [{"role": d.role, "turns": d.turns} for d in result.book.dropped])
        # call k of the role is its k-th turn; a discarded attempt or a call with no room left has no range
        ranges = [conv.ranges[r] for k, r in enumerate(conv.call_ranges) if r is not None and (k >= len(keep) or keep[k])]
        ok = result.status == "ok"
        if reward is None or route in ("drop", "resample", "error") or not ok:
            ranges = []  # not trained on: no reward, a dropped (or failed) group, or a failed session
        value = 0.0 if reward is None or not ok else reward
        logs = {"askspec_session_ok": float(ok), "askspec_trained_turns": float(len(ranges)),
                "askspec_kept_attempts": float(conv.kept_attempts), **(logs or {})}
        return {
            "prompt": prompt,
            "label": self._label(label, result),
            "images": None,
            "mm_train_inputs": None,
            "reward": value,
            "scores": value,
            "observation_tokens": list(conv.ids),
            "action_ranges": ranges,
            "rollout_log_probs": conv.logprobs,
            "truncated": conv.truncated,
            "extra_logs": logs,
        }
