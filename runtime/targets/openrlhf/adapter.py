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

Every session is recorded in a run directory per rollout process (`$ASKSPEC_RUNS`, else
`runs/` in the job folder), queryable with `askspec query` like any run.
"""

from __future__ import annotations

import asyncio
import atexit
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
from askspec.runtime.engine.session import Engine, ModelBinding, SessionFailed, SessionResult
from askspec.runtime.engine.stateful import StatefulScorers
from askspec.runtime.scoring.trajectory import trained_turns, trajectory_return
from askspec.runtime.targets.openrlhf.tokens import Conversation, OpenRLHFBackend

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
HOST_ENV = "ASKSPEC_FROZEN_HOST"  # where the frozen roles' servers listen (default 127.0.0.1)


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

    def turn(self, session_id: str, attempt: int, **kw: Any) -> None:
        if kw.get("role") == self.role and kw.get("group_id") is None:  # not a group's judge call
            self.turns.setdefault(session_id, []).append(kw["turn_index"])
        self.writer.turn(session_id, attempt, **kw)

    def reward(self, session_id: str, attempt: int, **kw: Any) -> None:
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
        for table in (self.turns, self.routed):
            table.pop(session_id, None)
        self.finished.discard(session_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


@dataclass
class _Group:
    """The N concurrent sessions of one prompt, routed together once all have finished."""

    group_id: str
    size: int
    round: int = 0
    joined: int = 0
    route: str = "none"  # the trained role's route, once the group is routed
    results: list[SessionResult] = field(default_factory=list)
    routed: asyncio.Event = field(default_factory=asyncio.Event)


class GameAgent:
    """Plays one session per `execute`; shared by every rollout of a process."""

    def __init__(self, job_dir: str | os.PathLike[str]) -> None:
        self.job_dir = Path(job_dir)
        job = json.loads((self.job_dir / JOB_FILE).read_text(encoding="utf-8"))
        self.job = job
        self.exp = ir.Experiment.model_validate(job["experiment"])
        self.role: str = job["trained_role"]
        self.group_size: int = int(job["group"])
        self.seed: int = int(job["seed"])
        self.max_turn_tokens = job.get("max_tokens")
        self.params = self.exp.param_values()
        spec_dir = str(self.job_dir / "spec")
        self.datasets = {d.name: load_dataset(d, spec_dir, self.seed) for d in self.exp.datasets}
        self.backend = OpenRLHFBackend()
        self._bindings: dict[tuple[str, str | None], ModelBinding] = {}
        self._engine: Engine | None = None
        self._recorder: _Recorder | None = None
        self._index = itertools.count()
        self._rounds: dict[tuple[str, int], int] = {}
        self._groups: dict[tuple, _Group] = {}

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
        endpoints = self.job["endpoints"]
        ep = endpoints["roles"].get(role) or endpoints["models"].get(name or "")
        if ep is None:
            raise SessionFailed(f"role '{role}': model '{name}' has no endpoint in {JOB_FILE}")
        options = dict(ep.get("options", {}))
        host = os.environ.get(HOST_ENV, "127.0.0.1")
        if isinstance(options.get("base_url"), str):
            options["base_url"] = options["base_url"].replace("{host}", host)
        elif isinstance(options.get("base_url"), list):
            options["base_url"] = [u.replace("{host}", host) for u in options["base_url"]]
        if ep["backend"] == "replay" and not os.path.isabs(options.get("file", "/")):
            options["file"] = str(self.job_dir / options["file"])
        try:
            backend = make_backend(ep["backend"], ep["weights"], options)
        except BackendError as e:
            raise SessionFailed(str(e)) from None
        return ModelBinding(name=name or role, backend=backend, weights=ep["weights"], sampling=sampling)

    def engine(self) -> Engine:
        if self._engine is None:
            self._recorder = _Recorder(self._open_writer(), self.role)
            self._engine = Engine(self.exp, params=self.params, datasets=self.datasets, writer=self._recorder,
                                  resolve_model=self.resolve, seed=self.seed, stateful=StatefulScorers())
        return self._engine

    def _open_writer(self) -> Any:
        from askspec.ir.canonical import experiment_hash, to_json
        from askspec.runtime.store.writer import RunWriter

        out = os.environ.get("ASKSPEC_RUNS") or str(self.job_dir / "runs")
        roles = {r.name: {"model": r.model, "trained": r.name == self.role} for r in self.exp.roles}
        writer = RunWriter.create(out, experiment=self.exp.name, experiment_hash=experiment_hash(self.exp),
                                  ir_json=to_json(self.exp), spec_files=self.job.get("spec_files", {}), seed=self.seed,
                                  roles=roles, params=self.params, planned_sessions=0,
                                  argv=["openrlhf-agent", str(self.job_dir), socket.gethostname(), str(os.getpid())])
        atexit.register(writer.close)  # a training job ends by stopping the process
        return writer

    def close(self) -> None:
        """Flush and close the run directory (also done at exit: a training job ends by
        stopping its processes)."""
        if self._recorder is not None:
            self._recorder.writer.close()

    # ------------------------------------------------------------------ one rollout
    async def execute(self, prompt: str, label: str, sampling_params: Any, max_length: int, hf_tokenizer: Any,
                      llm_engine: Any) -> dict[str, Any]:
        element = json.loads(label)
        engine = self.engine()
        recorder = self._recorder
        game = engine.games[element["game"]]
        size = self.group_size if self.group_size > 1 else 1
        key = (id(sampling_params), prompt, label)
        group = self._join(key, element, size)
        member = group.joined - 1
        index = next(self._index)
        plan = SessionPlan(index=index, session_id=f"s{index:06d}", game=game.name,
                           group_id=group.group_id if size > 1 else None, group_size=size,
                           bindings=dict(element.get("bindings") or {}),
                           seed=derive_seed(self.seed, game.name, int(element["element"]), group.round, member))
        conv = Conversation(tokenizer=hf_tokenizer, engine=llm_engine, sampling_params=sampling_params,
                            max_length=max_length)
        self.backend.conversations[index] = conv
        if size > 1:
            await asyncio.sleep(0)  # siblings started in the same gather join before any session runs
        try:
            result = await engine.run_session(plan)
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
            return self._response(prompt, label, plan, result, conv, recorder, group.route)
        finally:
            recorder.forget(plan.session_id)

    def _join(self, key: tuple, element: dict, size: int) -> _Group:
        group = self._groups.get(key)
        if group is None or group.joined >= size:
            # the k-th group of an element in this process is repeat k of `askspec run`'s plan:
            # the same group id and session seeds (plan.py), so both play the same sessions
            game, index = element["game"], int(element["element"])
            n = self._rounds.get((game, index), 0)
            self._rounds[(game, index)] = n + 1
            group = self._groups[key] = _Group(group_id=f"{game}-g{index:05d}-r{n:03d}", size=size, round=n)
        group.joined += 1
        if group.joined == size:
            self._groups.pop(key, None)  # full: the next call with this key starts a new group
        return group

    def _response(self, prompt: str, label: str, plan: SessionPlan, result: SessionResult, conv: Conversation,
                  recorder: _Recorder, route: str) -> dict[str, Any]:
        sid = plan.session_id
        turns = recorder.turns.get(sid, [])
        reward = trajectory_return(result.rewards, self.role, None, recorder.routed.get(sid))
        keep = trained_turns(turns, self.role, [{"role": d.role, "turns": d.turns} for d in result.book.dropped])
        # call k of the role is its k-th turn; a discarded attempt or a call with no room left has no range
        ranges = [conv.ranges[r] for k, r in enumerate(conv.call_ranges) if r is not None and (k >= len(keep) or keep[k])]
        if reward is None or route in ("drop", "resample") or result.status != "ok":
            ranges = []  # not trained on: no reward, a dropped group, or a failed session
        value = 0.0 if reward is None else reward
        logs = {"askspec_session_ok": float(result.status == "ok"), "askspec_trained_turns": float(len(ranges)),
                "askspec_kept_attempts": float(conv.kept_attempts)}
        return {
            "prompt": prompt,
            "label": label,
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
