"""The runtime behind a generated verifiers 0.4.0 environment (`askspec compile --target
verifiers`): one verifiers episode is one session of the compiled game, played by askspec's
own engine, and every model call of every role goes through that role's verifiers agent.

verifiers owns the episode: `Env.run(task, agents)` gets one agent per role (the fields of
the generated `EnvConfig`). Each agent runs the `Seat` harness, which runs in-process (the
harness contract allows it as long as every model call reaches the interception endpoint
with its secret): it announces its endpoint to the episode's `Table` and stays open until
the session has ended. The engine then plays the session with each role bound to askspec's
openai backend pointed at that role's endpoint, so verifiers records every call on the
role's trace (tokens, the trained role's sampling) and forwards it to the role's model:
the run's model for the trained role, the pinned model and client for a frozen one.

Rewards: each role's trace gets the role's return, the training contract of
runtime/scoring/trajectory.py (the sum of the role's rewards in the session), as the
reward `askspec`, and each named reward's sum as a metric. A session that fails is an
episode error (the exception carries the engine's message)."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import verifiers.v1 as vf

from askspec.ir import model as ir
from askspec.runtime.backends.openai_backend import OpenAIBackend
from askspec.runtime.engine.plan import SessionPlan, load_dataset, plan_sessions
from askspec.runtime.engine.session import Engine, ModelBinding, SessionFailed, SessionResult
from askspec.runtime.scoring.trajectory import trajectory_return

GAME_FILE = "game.json"  # the compiled spec and what the environment needs of it (generate.py)
REWARD = "askspec"  # the reward each role's trace carries: the role's return


@dataclass
class Game:
    """The generated package's game.json (the IR, its seed, the trained role, the frozen
    roles' pins) and the spec's data sets, read from the package's spec/ copy."""

    exp: ir.Experiment
    seed: int
    trained: str | None
    datasets: dict[str, list] = field(default_factory=dict)
    pins: dict[str, dict[str, Any]] = field(default_factory=dict)  # frozen role -> its AgentConfig's model, client

    @classmethod
    def load(cls, package_dir: Path) -> Game:
        data = json.loads((package_dir / GAME_FILE).read_text(encoding="utf-8"))
        exp = ir.Experiment.model_validate(data["experiment"])
        spec_dir = package_dir / "spec"
        seed = int(data["seed"])
        datasets = {d.name: load_dataset(d, str(spec_dir), seed) for d in exp.datasets}
        return cls(exp=exp, seed=seed, trained=data.get("trained"), datasets=datasets,
                   pins=data.get("pins", {}))

    @property
    def roles(self) -> list[str]:
        return [r.name for r in self.exp.roles]

    def plans(self) -> list[SessionPlan]:
        return list(plan_sessions(self.exp, self.exp.param_values(), self.datasets, self.seed))


def seat(game: Game, role: str) -> vf.AgentConfig:
    """A role's agent: in a subprocess runtime (which provisions nothing: the seat runs
    in-process), the trained role on the run's model, a frozen one pinned. Its harness is
    left to verifiers' default, the harness the taskset's package exports (the Seat)."""
    return vf.AgentConfig.model_validate({"runtime": {"type": "subprocess"}, **game.pins.get(role, {})})


class SessionData(vf.TaskData):
    """One planned session of the spec (runtime/engine/plan.py's SessionPlan), as a task."""

    index: int
    session_id: str
    game: str
    bindings: dict[str, Any] = {}
    seed: int = 0
    item_index: int | None = None
    table: str | None = None  # inside an episode: the key of its Table (what each Seat joins)

    def plan(self) -> SessionPlan:
        return SessionPlan(index=self.index, session_id=self.session_id, game=self.game, group_id=None,
                           group_size=1, bindings=dict(self.bindings), seed=self.seed, item_index=self.item_index)


class SessionTask(vf.Task[SessionData, vf.State, vf.TaskConfig]):
    pass


class SessionTasks:
    """The taskset mixin: one task per session of the spec's plan (`askspec run`'s order)."""

    GAME: Game
    config: Any

    def load(self):
        for p in self.GAME.plans():
            # the prompt only names the session (verifiers wants one to open a run): the
            # engine builds every call's messages from the spec
            data = SessionData(name=f"{p.game}#{p.item_index}", prompt=_describe(p), index=p.index,
                               session_id=p.session_id, game=p.game, bindings=_json_safe(p.bindings), seed=p.seed,
                               item_index=p.item_index)
            yield SessionTask(data, self.config.task)


def _describe(p: SessionPlan) -> str:
    return f"askspec session {p.session_id}: game {p.game} with {json.dumps(_json_safe(p.bindings), sort_keys=True)}"


def _json_safe(value: Any) -> Any:
    """Bindings as task data (they come from the spec's lists and data sets: JSON values)."""
    return json.loads(json.dumps(value))


class Table:
    """One episode's meeting point: each role's Seat announces (endpoint, secret) and waits
    for the session to end."""

    def __init__(self, roles: list[str]) -> None:
        self.roles = roles
        self.endpoints: dict[str, tuple[str, str]] = {}
        self.seated = asyncio.Event()
        self.ended = asyncio.Event()

    def sit(self, role: str, endpoint: str, secret: str) -> None:
        self.endpoints[role] = (endpoint, secret)
        if set(self.endpoints) >= set(self.roles):
            self.seated.set()


TABLES: dict[str, Table] = {}  # open episodes in this process, by their task data's `table`


class SeatConfig(vf.HarnessConfig):
    pass


class Seat(vf.Harness[SeatConfig]):
    """A role's seat in the episode: no program of its own; the engine's calls for the role
    go to this rollout's interception endpoint while the seat is open."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        table = TABLES.get(getattr(data, "table", None) or "")
        if table is None:
            return vf.ProgramResult(exit_code=1, stdout="", stderr="an askspec seat runs only inside its env's episode")
        table.sit(trace.agent.name, endpoint, secret)
        await table.ended.wait()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


class _Unrecorded:
    """The engine's Recorder (runtime/engine/recorder.py) inside an episode: the session is
    verifiers' record (its traces), so only the result matters here."""

    def session_started(self, *a: Any, **k: Any) -> int:
        return 1

    def turn(self, *a: Any, **k: Any) -> None:
        pass

    reward = session_finished = group = match = buffer_event = turn


class GameEnv:
    """The env mixin: `run` plays one session with every role seated, `finalize` is not
    needed (the rewards are known when the session ends)."""

    GAME: Game

    async def setup(self, agents) -> None:
        for role in self.GAME.roles:
            if role != self.GAME.trained:
                getattr(agents, role).trainable = False

    async def run(self, task, agents) -> None:
        game = self.GAME
        key = uuid.uuid4().hex
        table = TABLES[key] = Table(game.roles)
        seat_task = type(task)(task.data.model_copy(update={"table": key}), task.config)
        runs = {role: asyncio.ensure_future(getattr(agents, role).run(seat_task)) for role in game.roles}
        seated = asyncio.ensure_future(table.seated.wait())
        result: SessionResult | None = None
        try:
            await asyncio.wait([seated, *runs.values()], return_when=asyncio.FIRST_COMPLETED)
            if table.seated.is_set():
                result = await _play(game, task.data.plan(), table)
        finally:  # every seat closes, and its trace joins the episode, whatever happened
            seated.cancel()
            table.ended.set()
            done = await asyncio.gather(*runs.values(), return_exceptions=True)
            TABLES.pop(key, None)
        traces = {t.agent.name: t for t in done if isinstance(t, vf.Trace)}
        if result is None:  # a seat ended before the session began: its trace says why
            errors = [f"{t.agent.name}: {e.type}: {e.message}" for t in traces.values() for e in t.errors]
            errors += [f"{type(e).__name__}: {e}" for e in done if isinstance(e, BaseException)]
            raise RuntimeError(f"a role's agent did not start: {'; '.join(errors) or 'no error recorded'}")
        if result.status != "ok":
            raise RuntimeError(f"session {task.data.session_id}: {result.error}")
        for role, trace in traces.items():
            value = trajectory_return(result.rewards, role)
            if value is not None:
                trace.record_reward(REWARD, value)
            named: dict[str, float] = {}
            for r, _turn, name, v in result.rewards:
                if r == role:
                    named[name] = named.get(name, 0.0) + float(v)
            trace.record_metrics(named)
            if result.outcome is not None:
                trace.info["outcome"] = result.outcome


async def _play(game: Game, plan: SessionPlan, table: Table) -> SessionResult:
    """The session, each role's calls to its seat's endpoint."""
    backends: dict[str, OpenAIBackend] = {}

    def resolve(role: str, name: str | None) -> ModelBinding:
        model = game.exp.model(name) if name else None
        if role not in backends:
            endpoint, secret = table.endpoints[role]
            # one attempt: verifiers' interception owns retries (a retried call would be a second turn)
            backends[role] = OpenAIBackend(model.weights if model else role, base_url=endpoint, api_key=secret,
                                           attempts=1)
        return ModelBinding(name=name or role, backend=backends[role], weights=model.weights if model else role,
                            sampling=dict(model.sampling) if model is not None else {})

    engine = Engine(game.exp, params=game.exp.param_values(), datasets=game.datasets, writer=_Unrecorded(),
                    resolve_model=resolve, seed=game.seed)
    try:
        return await engine.run_session(plan)
    except SessionFailed as e:
        raise RuntimeError(f"session {plan.session_id}: {e}") from None
    finally:
        for b in backends.values():
            await b.aclose()
