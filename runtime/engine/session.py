"""The session engine: an async interpreter over the game-graph IR.

Many sessions run concurrently (bounded by `concurrency`); each session walks its game's
steps, sends each role's turn to its backend, parses the reply, applies recovery prompts,
evaluates rewards and records every turn through the run store's writer. A model call
that fails after the backend's retries marks that session `error` and the run goes on.
Groups (`sample N` games) are routed once all their members have finished.

Prompts render in Jinja2's immutable sandbox; model output only ever enters templates as
variable values, never as template source."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Awaitable, Callable, ContextManager, Iterable, NamedTuple, Sequence

from askspec.ir import model as ir

from askspec.runtime.backends.base import BackendError, ChatRequest, Sampling
from askspec.runtime.backends.loop import let_loop_run, loop_due
from askspec.runtime.engine.calls import (ModelCalls, TurnListener, call_seed, parse_reply, reply_parser,
                                          role_seed_part, seed_from_part)
from askspec.runtime.engine.evaluator import Env, EvalError, RoleView, evaluate
from askspec.runtime.engine.judges import EngineJudges
from askspec.runtime.engine.plan import SessionPlan, plan_games, replays_buffer
from askspec.runtime.engine.prompts import Prompts
from askspec.runtime.engine.recorder import Recorder
from askspec.runtime.engine.routing import GroupRouter, JudgeTally
from askspec.runtime.engine.state import (DroppedTurns, EndSession, ModelBinding, Reply, RunAborted, SessionFailed,
                                          SessionResult, SessionState, SharedTurn, StatefulCall)
from askspec.runtime.engine.stateful import OrderGate, StatefulScorers, calls_stateful
from askspec.runtime.scoring.buffers import ReplayBuffer

__all__ = ["Engine", "EndSession", "ModelBinding", "RunAborted", "SessionFailed", "SessionResult", "SessionState",
           "call_seed", "parse_reply"]


class Engine:
    """Runs planned sessions of one experiment against a run recorder (the store's writer)."""

    def __init__(self, exp: ir.Experiment, *, params: dict[str, Any], datasets: dict[str, list], writer: Recorder,
                 resolve_model: Callable[[str, str | None], ModelBinding], seed: int = 0,
                 concurrency: int = 8, stateful: StatefulScorers | None = None,
                 on_session_done: Callable[[SessionResult], None] | None = None,
                 on_turn: TurnListener | None = None, on_plan: Callable[[int], None] | None = None,
                 on_tokens: Callable[[int], None] | None = None,
                 max_sessions: int | None = None, on_warning: Callable[[str], None] | None = None,
                 rollout_roles: frozenset[str] = frozenset(), on_rollout: Callable[..., None] | None = None,
                 around_phase: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> None:
        self.exp = exp
        self.params = params
        self.datasets = datasets
        self.writer = writer
        self.resolve_model = resolve_model  # (role, model name or None) -> binding
        self.seed = seed
        self.concurrency = max(1, concurrency)
        self.stateful = stateful
        self.on_session_done = on_session_done
        self.on_warning = on_warning  # e.g. a route's judge fails most of its calls
        self.roles = {r.name: r for r in exp.roles}
        self.games = {g.name: g for g in exp.games}
        self.prompts = Prompts(exp.templates)
        self._role_calls: dict[tuple[str, str | None], _RoleCall] = {}
        # every model call goes through here and is recorded; on_turn hears of each recorded
        # call, on_tokens (thread-safe) of tokens while a backend generates them
        self.calls = ModelCalls(writer, on_turn, on_tokens, defaults=exp.sampling_defaults)
        # data sets and buffers, readable from expressions; buffers fill during a phase and
        # their new items become visible when the phase ends (in session order, so the
        # contents do not depend on scheduling)
        self.buffers = {b.name: ReplayBuffer(b.name, b.capacity, b.eviction, int(b.options.get("patience", 3)),
                                             on_event=self._buffer_event, best_field=b.options.get("best"))
                        for b in exp.buffers}
        self.buffer_scores = {b.name: b.score for b in exp.buffers}
        self._buffer_when: dict[str, Any] = {"step": None, "phase": None}  # a training schedule's (enter_step)
        self.collections: dict[str, list] = {**datasets, **{name: b.items for name, b in self.buffers.items()}}
        self.max_sessions = max_sessions  # a cap over all phases (whole groups)
        # trained roles: their turns ask the backend for token ids and log-probs, handed to
        # on_rollout(plan, attempt, turn_index, role, result, temperature, sample_key)
        self.rollout_roles = rollout_roles
        self.on_rollout = on_rollout
        self.on_plan = on_plan  # a later phase planned n more sessions
        # entered around each phase's sessions: a command that owns its process freezes the
        # heap there (commands/heap.py); the engine itself changes nothing process-wide
        self.around_phase = around_phase
        self._gate = OrderGate()
        # id(step) -> (whether it calls diversity/novelty, its method, for a plain ask of one
        # role (no message, context or sample) its (role, template, target)), worked out once
        self._step_kinds: dict[int, tuple[bool, Any, tuple[str, str | None, str | None] | None]] = {}
        self.router = GroupRouter(exp, params, seed, writer,
                                  EngineJudges(self.calls, self.roles, resolve_model, self.render, params, seed))
        self.judge_tallies: dict[tuple[str, str, str], JudgeTally] = {}  # (game, role, contest) -> run totals
        self._warned: set[tuple[str, str, str]] = set()

    # ------------------------------------------------------------------ templates
    def render(self, key: str, ctx: dict[str, Any]) -> str:
        """The template `key` rendered in the sandbox with the variables it uses from `ctx`."""
        return self.prompts.render(key, ctx)

    # ------------------------------------------------------------------ running
    async def run(self, plans: Iterable[SessionPlan], done: set[str] | None = None,
                  prior: dict[str, SessionResult] | None = None, routed: set[str] | None = None) -> list[SessionResult]:
        """Run `plans` (the first phase, iterated lazily), then one phase per game that
        replays a buffer.

        `done` are sessions finished by an earlier, interrupted run of the same plan;
        `prior` holds their results (for group routing and buffer contents) and `routed`
        the groups whose route was already recorded."""
        done, prior, routed = done or set(), prior or {}, routed or set()
        if self.stateful is not None:  # resume: earlier sessions' texts, in session order
            for res in sorted(prior.values(), key=lambda r: r.plan.index):
                for call in res.book.stateful:
                    self.stateful.replay(call.fn, call.site, call.text, call.kwargs)
        results: dict[int, SessionResult] = {}
        phase: Iterable[SessionPlan] = plans
        planned = 0
        deferred = [g for g in self.exp.games if replays_buffer(g) is not None]
        replay_ids: dict[str, list[int]] = {}
        while True:
            scores: dict[int, Any] = {}
            indices = await self._run_phase(phase, done, prior, routed, results, scores)
            planned += len(indices)
            self.commit(indices, results, scores, replay_ids)
            if not deferred:
                break
            game = deferred.pop(0)
            room = None if self.max_sessions is None else self.max_sessions - planned
            if room is not None and room <= 0:
                break
            name = replays_buffer(game)
            replay_ids = {game.name: list(self.buffers[name].ids)} if name in self.buffers else {}
            phase = plan_games([game], self.params, self.collections, self.seed, room, start=planned)
            if self.on_plan:
                self.on_plan(len(phase))
        return [results[k] for k in sorted(results)]

    async def _run_phase(self, plans: Iterable[SessionPlan], done: set[str], prior: dict[str, SessionResult],
                         routed: set[str], results: dict[int, SessionResult],
                         scores: dict[int, Any] | None = None) -> list[int]:
        """Play one phase with `concurrency` workers pulling sessions from the (lazy) plan
        in order; returns the indices of the phase's sessions. `scores` receives, per
        session of a game that replays a scored buffer, its score variable."""
        members: dict[str, list[SessionResult]] = {}
        route_tasks: list[asyncio.Task] = []
        indices: list[int] = []
        pending = iter(plans)
        scored = self._scored_games()

        def finished(p: SessionPlan, res: SessionResult) -> None:
            if scores is not None and p.game in scored and res.status == "ok":
                scores[p.index] = res.vars.get(scored[p.game])
            # keep only a slim record per session: a long run must not hold every transcript
            results[p.index] = res.slim()
            if p.group_id and p.group_id not in routed:
                group = members.setdefault(p.group_id, [])
                group.append(res)
                if len(group) == p.group_size:
                    del members[p.group_id]
                    route_tasks.append(asyncio.create_task(self.route_group(p.group_id, group)))

        async def worker() -> None:
            # Sessions are taken in plan order, so when one is taken every earlier session
            # of the phase is either finished or in flight (what the order gate relies on).
            for p in pending:
                indices.append(p.index)
                if p.session_id in done:  # finished by an earlier run: kept, counted in its group
                    if p.session_id in prior:
                        finished(p, prior[p.session_id])
                    continue
                self._gate.started(p.index)
                try:
                    res = await self.run_session(p)
                except (asyncio.CancelledError, Exception):
                    raise
                except BaseException as e:  # see RunAborted
                    raise RunAborted(e) from e
                finally:
                    await self._gate.finished(p.index)
                if self.on_session_done:
                    self.on_session_done(res)
                finished(p, res)
                # Let the event loop run between sessions (every few ms): a backend that
                # answers without waiting would otherwise keep it from ever handling a
                # signal (Ctrl-C) or a timer.
                if loop_due():
                    await let_loop_run()

        self._gate.reset([])
        with self.around_phase():
            await _all_or_none([asyncio.ensure_future(worker()) for _ in range(self.concurrency)])
            if route_tasks:
                await _all_or_none(route_tasks)
        return indices

    async def run_phase(self, plans: list[SessionPlan], replay_ids: dict[str, list[int]] | None = None
                        ) -> list[SessionResult]:
        """Play `plans` as one phase (a training step), then commit its buffer pushes and
        replays; games that replay a buffer are not planned here (the caller planned them:
        `replay_ids` maps such a game to the buffer ids of its plan's `item_index`es)."""
        results: dict[int, SessionResult] = {}
        scores: dict[int, Any] = {}
        indices = await self._run_phase(plans, set(), {}, set(), results, scores)
        self.commit(indices, results, scores, replay_ids or {})
        return [results[k] for k in sorted(results)]

    def _scored_games(self) -> dict[str, str]:
        """game -> the score variable of the buffer it replays (when it has one)."""
        out: dict[str, str] = {}
        for g in self.exp.games:
            name = replays_buffer(g)
            score = self.buffer_scores.get(name) if name is not None else None
            if score:
                out[g.name] = score
        return out

    def commit(self, indices: list[int], results: dict[int, SessionResult], scores: dict[int, Any],
               replay_ids: dict[str, list[int]]) -> None:
        """After a phase, in session order: each replayed item's replay (the mean score of
        its sessions in the phase), which may evict it; then the phase's pushes."""
        replays: dict[tuple[str, int], list[Any]] = {}
        for index in sorted(indices):
            res = results.get(index)
            if res is None or res.plan.game not in replay_ids or res.plan.item_index is None:
                continue
            ids = replay_ids[res.plan.game]
            if res.plan.item_index < len(ids):
                buffer = replays_buffer(self.games[res.plan.game])
                assert buffer is not None  # replay_ids holds only games that replay a buffer
                replays.setdefault((buffer, ids[res.plan.item_index]), []).append(scores.get(index))
        for (name, item_id), got in replays.items():
            nums = [float(v) for v in got if isinstance(v, (int, float)) and not isinstance(v, bool)]
            self.buffers[name].replayed(item_id, sum(nums) / len(nums) if nums else None)
        for index in sorted(indices):
            res = results.get(index)
            for name, value in (res.book.pushes if res else []):
                self.buffers[name].add(value)

    def enter_step(self, step: int, phase: str) -> None:
        """A training schedule's step begins: the buffer events from now on are recorded
        as this step's, of this phase (an evaluation run's have neither)."""
        self._buffer_when = {"step": step, "phase": phase}

    def _buffer_event(self, ev: dict) -> None:
        self.writer.buffer_event(**ev, **self._buffer_when)

    async def run_session(self, p: SessionPlan) -> SessionResult:
        game = self.games[p.game]
        attempt = self.writer.session_started(p.session_id, game=p.game, group_id=p.group_id, params=_jsonable(p.bindings),
                                              index=p.index, step=p.step, stage=p.stage, weights=p.weights,
                                              seed=p.seed)
        st = SessionState(plan=p, attempt=attempt, vars=dict(p.bindings), roles={r: RoleView(r) for r in self.roles})
        if self.stateful is not None:
            scorer = self.stateful

            def stateful(fn: str, site: str, args: list, kwargs: dict) -> Any:
                text = "" if not args or args[0] is None else str(args[0])
                st.book.stateful.append(StatefulCall(fn, site, text, kwargs))
                return scorer(fn, site, text, kwargs)

            st.stateful = stateful
        status, error = "ok", None
        try:
            await self.steps(game.body, st)
        except EndSession as end:
            if end.outcome is not None:
                st.outcome = end.outcome
        except (SessionFailed, EvalError, BackendError) as e:
            status, error = "error", str(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug must not take the whole run down
            status, error = "error", f"internal error: {e.__class__.__name__}: {e}"
        res = SessionResult.of(st, status, error)
        scalars = {k: v for k, v in st.vars.items() if recordable(v)}
        self.writer.session_finished(p.session_id, attempt, status=status, outcome=st.outcome, error=error, vars=scalars,
                                     bookkeeping=res.book.to_json())
        return res

    # ------------------------------------------------------------------ steps
    def env(self, st: SessionState) -> Env:
        return Env(vars=st.vars, params=self.params, roles=st.roles, stateful=st.stateful, collections=self.collections,
                   seed=st.plan.seed)

    async def steps(self, steps: list, st: SessionState) -> None:
        for s in steps:  # each step inline (no coroutine of its own)
            kind = self._step_kinds.get(id(s))
            if kind is None:
                kind = self._step_kinds[id(s)] = _step_kind(s)
            ordered, method, plain_ask = kind
            if ordered:  # run-level history: wait for every earlier session (determinism)
                await self._gate.wait_for_earlier(st.plan.index)
            if plain_ask is not None:  # `ask`'s common case inline: one role, one reply, nothing to evaluate
                role, template, target = plain_ask
                st.asks += 1
                reply = await self.call_role(role, template, {**self.params, **st.vars}, None, st, remember=True,
                                             own_ctx=True)
                if target:
                    st.vars[target] = reply
            elif method in _SIMPLE_METHODS:
                method(self, s, st)
            else:
                await method(self, s, st)

    # steps that never wait on a model
    def _assign(self, s: ir.AssignStep, st: SessionState) -> None:
        st.vars[s.name] = evaluate(s.value, self.env(st))

    def _outcome(self, s: ir.OutcomeStep, st: SessionState) -> None:
        st.outcome = evaluate(s.value, self.env(st))
        st.vars["outcome"] = st.outcome

    def _bind(self, s: ir.BindStep, st: SessionState) -> None:
        name = evaluate(s.model, self.env(st))
        if not isinstance(name, str) or not name:
            raise SessionFailed(f"bind {s.role}: a model name was expected, got {name!r}")
        st.bound[s.role] = name

    def _reward(self, s: ir.RewardStep, st: SessionState) -> None:
        value = evaluate(s.value, self.env(st))
        try:
            value = float(value)
        except (TypeError, ValueError, OverflowError):
            raise SessionFailed(f"reward {s.name}: not a number ({value!r})") from None
        if value - value != 0.0:  # NaN or ±inf (inf - inf is nan): it would poison every advantage of its group
            named = "" if s.name == "reward" else f" '{s.name}'"
            raise EvalError(f"the reward{named} of {s.role} is {value!r}, not a finite number: check the expression "
                            f"(an overflow, inf - inf, a log of 0?)", s.value.span or s.span)
        turn = None
        if s.turn_var is not None:
            reply = st.vars.get(s.turn_var)
            if not isinstance(reply, Reply):
                raise SessionFailed(f"reward {s.turn_var}: not a reply")
            turn = reply.turn
        st.rewards.append((s.role, turn, s.name, value))
        self.writer.reward(st.plan.session_id, st.attempt, role=s.role, turn_index=turn, name=s.name, value=value,
                           kind="turn" if turn is not None else "terminal")

    def _end(self, s: ir.EndStep, st: SessionState) -> None:
        raise EndSession(s.outcome)

    def _push(self, s: ir.PushStep, st: SessionState) -> None:
        st.book.pushes.append((s.buffer, _jsonable(evaluate(s.value, self.env(st)))))

    def _drop(self, s: ir.DropStep, st: SessionState) -> None:
        turns = None
        if s.turn_var is not None:
            held = st.vars.get(s.turn_var)
            held = held if isinstance(held, list) else [held]
            turns = [r.turn for r in held if isinstance(r, Reply)]
        st.book.dropped.append(DroppedTurns(s.role, turns))

    # steps with bodies (or model calls)
    async def _if(self, s: ir.IfStep, st: SessionState) -> None:
        for b in s.branches:
            if evaluate(b.cond, self.env(st)):
                await self.steps(b.body, st)
                return
        await self.steps(s.orelse, st)

    async def _repeat(self, s: ir.RepeatStep, st: SessionState) -> None:
        env = self.env(st)
        lo = int(evaluate(s.start, env))
        hi = int(evaluate(s.stop, env))
        for i, v in enumerate(range(lo, hi + 1)):
            if i >= s.bound:
                break
            if s.var:
                st.vars[s.var] = v
            await self.steps(s.body, st)

    async def _while(self, s: ir.WhileStep, st: SessionState) -> None:
        for _ in range(s.limit):
            c = bool(evaluate(s.cond, self.env(st)))
            if c == s.until:  # while: stop when false; until: stop when true
                break
            await self.steps(s.body, st)

    async def _for(self, s: ir.ForStep, st: SessionState) -> None:
        seq = evaluate(s.iter, self.env(st))
        if not isinstance(seq, list):
            raise SessionFailed(f"for: expected a list, got {type(seq).__name__}")
        for item in seq[: s.limit]:
            if len(s.names) == 1:
                st.vars[s.names[0]] = item
            else:
                for n, v in zip(s.names, item):
                    st.vars[n] = v
            await self.steps(s.body, st)

    # ------------------------------------------------------------------ asking
    async def ask(self, s: ir.AskStep, st: SessionState) -> None:
        """An ask with a message, context or sample, or of several roles (`steps` runs the
        plain one inline)."""
        st.asks += 1
        base_ctx = {**self.params, **st.vars}
        env = self.env(st)
        message = evaluate(s.message, env) if s.message is not None else None
        context = evaluate(s.context, env) if s.context is not None else {}
        n = int(evaluate(s.sample, env)) if s.sample is not None else None
        if isinstance(context, dict):
            base_ctx.update(context)
        if message is not None:
            base_ctx["message"] = message

        serial = None
        if n is not None:
            serial, st.sample_asks = st.sample_asks, st.sample_asks + 1

        async def for_role(role: str):
            over = s.sampling_for(role) or None  # the ask's fields, the role's own over them
            if n is None:
                return await self.call_role(role, s.template, base_ctx, message, st, remember=True, sampling=over)
            return await _gather_all_or_none([self.call_role(role, s.template, base_ctx, message, st, remember=False,
                                                             sample_index=i, sample_key=f"x{serial}.{i}", sampling=over)
                                              for i in range(n)])

        if len(s.roles) == 1:  # the common case; a task per role would add one per call
            replies = [await for_role(s.roles[0])]
        else:
            replies = await _gather_all_or_none([for_role(r) for r in s.roles])
        for target, reply in zip(s.targets, replies):
            if target:
                st.vars[target] = reply

    def role_call(self, role: str, st: SessionState) -> _RoleCall:
        """What every call of `role` on its current model needs, prepared once per (role,
        binding). The binding is asked for on every call: a trainer's resolver answers
        with other weights from one stage to the next."""
        name = st.bound.get(role) or self.roles[role].model
        binding = self.resolve_model(role, name)
        hit = self._role_calls.get((role, name))
        if hit is None or hit.binding is not binding:
            r = self.roles[role]
            base, model_seed = self.calls.sampling(role, r, binding)
            hit = self._role_calls[(role, name)] = _RoleCall(
                r, binding, base, model_seed, r.recover.retries,
                int(r.reply.args.get("retries", 0)) if r.reply.kind == "json" else 0,
                r.memory.kind, r.memory.size, role in self.rollout_roles, reply_parser(r.reply),
                role_seed_part(role, model_seed), r.prompt, r.system)
        return hit

    async def call_role(self, role: str, template: str | None, ctx: dict[str, Any], message: Any, st: SessionState,
                        remember: bool, sample_index: int = 0, sample_key: str | None = None, own_ctx: bool = False,
                        sampling: dict[str, Any] | None = None) -> Reply:
        """One turn of `role` (and its recovery turns, under the same `sampling`: an ask's
        `with sampling` fields). `ctx` is not changed unless `own_ctx` says it is the
        caller's to give away."""
        rc = self.role_call(role, st)
        r = rc.role
        st.roles[role].model = rc.binding.name
        turn_no = st.calls.get(role, 0) + 1
        if own_ctx:
            ctx["role"], ctx["turn"] = role, turn_no
        else:
            ctx = {**ctx, "role": role, "turn": turn_no}
        key = template or rc.prompt
        if key is not None:
            user = self.prompts.render(key, ctx)
        else:
            user = "" if message is None else str(message)
        if rc.system is not None and role not in st.system:
            st.system[role] = self.prompts.render(rc.system, ctx)
        conversation = r.memory.conversation if rc.memory == "shared" else None
        ask_no = st.asks
        if conversation is not None:
            messages = ([{"role": "system", "content": st.system[role]}] if role in st.system else []) + \
                shared_view(st.shared.get(conversation, ()), role, ask_no, user)
            history = messages
        else:
            history = st.history.get(role) or []
            messages = ([{"role": "system", "content": st.system[role]}] if role in st.system else []) + history
            messages.append({"role": "user", "content": user})
        uncut = messages[-1]
        if r.max_prompt_tokens is not None and not any(m["role"] == "assistant" for m in history):
            messages = await self.fit_prompt(role, rc, messages)  # the prompt opens the role's conversation
        asked = messages[-1]
        reply = await self.model_call(role, rc, messages, st, sample_index, sample_key, sampling)
        retries = rc.retries
        attempt = 0
        while not reply["parsed"] and attempt < max(retries, rc.json_retries):
            attempt += 1
            rkey = r.recover.truncated if reply["truncated"] else r.recover.malformed
            if attempt <= retries and rkey is not None:
                recover_ctx = {**ctx, "reply": reply["text"], "missing": reply.missing}
                recovery = self.prompts.render(rkey, recover_ctx)
                messages = messages + [{"role": "assistant", "content": reply["text"]}, {"role": "user", "content": recovery}]
            # without a recovery template (json retries) the same prompt is re-sampled
            reply = await self.model_call(role, rc, messages, st, sample_index, sample_key, sampling)
        if role not in st.first_user:
            st.first_user[role] = user
        if remember and conversation is not None:
            # in the order replies arrive; shared_view orders them
            cut = asked["content"] if asked is not uncut else None
            st.shared.setdefault(conversation, []).append(SharedTurn(ask_no, reply.turn, role, user, reply["text"], cut))
        elif remember and rc.memory != "none":
            # the message sent, itself (the store then finds the next prompt's head equal by identity)
            new = history + [asked, {"role": "assistant", "content": reply["text"]}]
            if rc.memory == "window":
                new = new[-2 * rc.window:]
            st.history[role] = new
        return reply

    async def fit_prompt(self, role: str, rc: _RoleCall, messages: list[dict]) -> list[dict]:
        """`messages` within the role's max_prompt_tokens, counted by the backend's
        tokenizer (prompt_tokens.py): as they are, cut from the left of the new message
        (`truncate_left`), or the session ends with the role's outcome (`end(OUTCOME)`)."""
        r = rc.role
        cap, over = r.max_prompt_tokens, r.prompt_overflow
        if cap is None or over is None:
            return messages
        tok = await rc.binding.backend.prompt_tokenizer(rc.binding.weights)
        n = tok.chat_length(messages)
        if n <= cap:
            return messages
        if over.mode == "end":
            raise EndSession(over.outcome)
        last = messages[-1]
        ids = tok.encode(last["content"])
        messages = list(messages)
        while n > cap:
            # a cut of the text re-encodes to about as many fewer tokens; cut again until it fits
            if n - cap >= len(ids):
                raise SessionFailed(f"{role}: the prompt is {n} tokens, over max_prompt_tokens = {cap}, and cutting its "
                                    f"new message does not bring it under (the system prompt and earlier messages "
                                    f"alone are too long): raise max_prompt_tokens or shorten the system prompt")
            ids = ids[n - cap:]
            messages[-1] = {**last, "content": tok.decode(ids)}
            n = tok.chat_length(messages)
        return messages

    async def model_call(self, role: str, rc: _RoleCall, messages: list[dict], st: SessionState,
                         sample_index: int, sample_key: str | None = None, sampling: dict[str, Any] | None = None) -> Reply:
        binding = rc.binding
        call_index = st.calls.get(role, 0)
        st.calls[role] = call_index + 1
        fields, seed_part = (rc.sampling, rc.seed_part) if not sampling else _over(role, rc, sampling)
        # call_seed(st.plan.seed, role, call_index, rc.model_seed), its role's part kept per role
        samp = Sampling(**fields, seed=seed_from_part(seed_part, st.plan.seed, call_index))
        stream = self.calls.stream()
        req = ChatRequest(messages=tuple(messages), sampling=samp, model=binding.weights, role=role,
                          session_index=st.plan.index, call_index=call_index, sample_key=sample_key,
                          rollout=rc.rollout, on_tokens=stream)
        # the turn's number is taken before the call, not when its reply arrives: the
        # roles of one `ask a, b` (and the samples of `sample n`) are numbered in the order
        # the spec names them, whichever backend answers first (a python callable on its
        # worker thread could overtake a replay and swap t1 and t2 from run to run)
        turn_index = st.turn_counter
        st.turn_counter += 1
        try:
            result, latency = await self.calls.complete(binding, req)
        except BackendError as e:
            raise SessionFailed(f"{role}: model call failed: {e}") from None
        fields, ok, missing = rc.parse(result.text)
        st.tokens += result.tokens_out
        fields.pop("text", None)
        # what the store records as `parsed`: the parser's fields and whether the reply
        # parsed (role, model, finish reason and tokens are columns of their own); the
        # fields are a new dict, so they become the record in place
        record = fields
        record["parsed"] = ok
        record["truncated"] = result.finish_reason == "length"
        reply = Reply({**record, "finish_reason": result.finish_reason, "tokens": result.tokens_out, "role": role,
                       "model": binding.name, "text": result.text}, turn=turn_index, missing=missing)
        st.roles[role].turns.append(reply)
        self.calls.record(st.plan.session_id, st.attempt, turn_index, role, binding, messages, result, record, latency,
                          streamed=stream.count if stream is not None else 0)
        if rc.rollout and self.on_rollout is not None and result.completion_ids is not None:
            self.on_rollout(st.plan, st.attempt, turn_index, role, result, samp.temperature, sample_key)
        return reply

    # ------------------------------------------------------------------ groups
    async def route_group(self, group_id: str, members: list[SessionResult]) -> None:
        for tally in await self.router.route(group_id, members):
            key = (tally.game, tally.route_role, tally.contest)
            total = self.judge_tallies.get(key)
            if total is None:
                total = self.judge_tallies[key] = JudgeTally(tally.game, tally.route_role, tally.contest, tally.judge)
            if tally.failing and key not in self._warned:  # once per route arm; the run summary has the totals
                self._warned.add(key)
                if self.on_warning:
                    self.on_warning(f"group {group_id}: {_judge_failure(tally)} (later groups are counted in the run summary)")
            total.calls += tally.calls
            total.unparsed += tally.unparsed

    def route_warnings(self) -> list[str]:
        """One line per route arm whose judge gave no verdict in most of its calls."""
        return [f"{_judge_failure(t)}, over the whole run" for t in self.judge_tallies.values() if t.failing]


class _RoleCall(NamedTuple):
    """A role on one model: what each of its calls needs (`Engine.role_call`)."""

    role: ir.Role
    binding: ModelBinding
    sampling: dict[str, Any]  # its Sampling's fields but the seed, which is set per call
    model_seed: int | None
    retries: int  # recovery prompts
    json_retries: int
    memory: str  # full | window | none | shared
    window: int
    rollout: bool
    parse: Callable[[str], tuple[dict[str, Any], bool, list[str]]]  # `reply_fields` for its parser
    seed_part: int  # what the role and model add to the call seed (`role_seed_part`)
    prompt: str | None  # the role's own prompt and system templates
    system: str | None


def _over(role: str, rc: _RoleCall, sampling: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The role's sampling fields with an ask's `with sampling` fields over them, and the
    seed part of its calls (a `seed` there stands for the model's). A --max-tokens cap
    (`ModelBinding.capped`) still holds."""
    fields = rc.binding.capped({**rc.sampling, **{k: v for k, v in sampling.items() if k != "seed"}})
    if "stop" in sampling:
        fields["stop"] = tuple(sampling["stop"])
    return fields, (role_seed_part(role, sampling["seed"]) if "seed" in sampling else rc.seed_part)


def shared_view(turns: Iterable[SharedTurn], role: str, ask_no: int, prompt: str) -> list[dict[str, str]]:
    """What `role` is sent from a shared conversation, its new message `prompt` last: its
    own turns as the messages it was sent and its replies (assistant), every other role's
    reply as a user message tagged with the speaker ("name: text"), up to this ask.
    User messages in a row are joined into one (chat templates want roles to alternate)."""
    out: list[dict[str, str]] = []

    def user(text: str) -> None:
        if out and out[-1]["role"] == "user":
            out[-1]["content"] = "\n\n".join(x for x in (out[-1]["content"], text) if x)
        else:
            out.append({"role": "user", "content": text})

    # within an ask, the role's own turn before the others' (it did not see them when it spoke)
    for t in sorted(turns, key=lambda t: (t.ask, t.speaker != role, t.turn)):
        if t.ask >= ask_no:
            break
        if t.speaker == role:
            if t.sent is not None:  # its prompt was cut: the message as it was sent, the others' turns in it
                if out and out[-1]["role"] == "user":
                    out.pop()
                out.append({"role": "user", "content": t.sent})
            else:
                user(t.prompt)
            out.append({"role": "assistant", "content": t.text})
        else:
            user(f"{t.speaker}: {t.text}")
    user(prompt)
    return out


def _step_kind(s: Any) -> tuple[bool, Any, tuple[str, str | None, str | None] | None]:
    """`Engine.steps`' view of a step: (whether it waits for earlier sessions, its method,
    (role, template, target) when it is a plain ask of one role)."""
    plain = None
    if (type(s) is ir.AskStep and s.message is None and s.context is None and s.sample is None
            and not s.sampling and not s.role_sampling and len(s.roles) == 1):
        plain = (s.roles[0], s.template, s.targets[0] if s.targets else None)
    method = _SIMPLE_STEPS.get(s.__class__) or _NESTED_STEPS[s.__class__]
    return calls_stateful(s), method, plain


def _judge_failure(t: JudgeTally) -> str:
    return (f"game {t.game}, route {t.route_role} -> {t.contest}: judge '{t.judge}' gave no parseable verdict in "
            f"{t.unparsed} of {t.calls} calls")


# IR step class -> the engine's method for it; steps that never wait run without a coroutine
_SIMPLE_STEPS: dict[type, Callable[[Engine, Any, SessionState], None]] = {
    ir.AssignStep: Engine._assign, ir.OutcomeStep: Engine._outcome, ir.BindStep: Engine._bind,
    ir.RewardStep: Engine._reward, ir.EndStep: Engine._end, ir.PushStep: Engine._push, ir.DropStep: Engine._drop,
}
_NESTED_STEPS: dict[type, Callable[[Engine, Any, SessionState], Awaitable[None]]] = {
    ir.AskStep: Engine.ask, ir.IfStep: Engine._if, ir.RepeatStep: Engine._repeat, ir.WhileStep: Engine._while,
    ir.ForStep: Engine._for,
}
_SIMPLE_METHODS = frozenset(_SIMPLE_STEPS.values())


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


async def _gather_all_or_none(coros: list[Awaitable[Any]]) -> list[Any]:
    """The results of `coros` run concurrently, in order; when one raises (a session
    ended or failed), the others are cancelled rather than left running after it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    await _all_or_none(tasks)
    return [t.result() for t in tasks]


async def _all_or_none(tasks: Sequence[asyncio.Future]) -> None:
    """Wait for every task; if one fails (or the wait is cancelled), cancel the others and
    wait until they have stopped, so nothing writes to the run after the engine returns."""
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


RECORDED_LIST = 1000  # a list variable is recorded when it holds at most this many plain values


def recordable(v: object) -> bool:
    """Whether a final session variable goes into the run store's `vars`: a number, string,
    bool or none, or a list of at most RECORDED_LIST of them (a built AskBench item's rubric,
    exported with `askspec query --format jsonl`); replies, records and long lists are not."""
    if v is None or isinstance(v, (int, float, str, bool)):
        return True
    return (isinstance(v, list) and len(v) <= RECORDED_LIST
            and all(x is None or isinstance(x, (int, float, str, bool)) for x in v))
