"""Group routing: once every session of a `sample N` group has finished, each route of
the game decides, from the group's rewards, whether the verifier rewards are kept, the
group is dropped, or the traces go to a pairwise tournament or a pointwise judge.

Routed rewards are stored next to the session rewards (name `tournament` / `judge`), and
the group records the route it took, its statistics and its members."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from askspec.ir import model as ir

from askspec.runtime.backends.base import BackendError, ChatRequest, Sampling
from askspec.runtime.engine.evaluator import Env, evaluate
from askspec.runtime.engine.plan import derive_seed

if TYPE_CHECKING:
    from askspec.runtime.engine.session import Engine, SessionResult


def role_total(res: "SessionResult", role: str) -> float:
    return float(sum(v for r, _, _, v in res.rewards if r == role))


def group_stats(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    return {"count": len(values), "mean": statistics.fmean(values), "var": statistics.pvariance(values),
            "std": statistics.pstdev(values), "min": min(values), "max": max(values)}


async def route_group(engine: "Engine", group_id: str, members: list["SessionResult"]) -> None:
    game = engine.games[members[0].plan.game]
    ok = sorted((m for m in members if m.status == "ok"), key=lambda m: m.plan.index)
    ids = [m.plan.session_id for m in ok]
    if not game.routes:
        engine.writer.group(group_id, route="none", stats=group_stats([]), members=ids)
        return
    for route in game.routes:
        rewards = [role_total(m, route.role) for m in ok]
        env = Env(vars={"rewards": rewards, "size": len(rewards)}, params=engine.params)
        arm = next((a for a in route.arms if a.cond is None or evaluate(a.cond, env)), None)
        stats = {**group_stats(rewards), "role": route.role}
        if arm is None or arm.action in ("keep", "drop") or not ok:
            action = "keep" if arm is None else arm.action
            engine.writer.group(group_id, route=action, stats=stats, members=ids)
            continue
        group_ctx = {"role": route.role, "rewards": rewards, "size": len(rewards)}
        extra: dict = {}
        if arm.action == "tournament":
            t = next(t for t in engine.exp.tournaments if t.name == arm.target)
            scores = await _tournament(engine, t, group_id, route.role, ok, group_ctx, extra)
            name = "tournament"
        else:
            j = next(j for j in engine.exp.judges if j.name == arm.target)
            scores = await _pointwise(engine, j, route.role, ok, group_ctx, extra)
            name = "judge"
        for m, score in zip(ok, scores):
            if score is None:
                continue
            engine.writer.reward(m.plan.session_id, m.attempt, role=route.role, turn_index=None, name=name,
                                 value=float(score), kind="terminal")
        engine.writer.group(group_id, route=f"{arm.action}:{arm.target}", stats={**stats, **extra, "routed": list(scores)}, members=ids)


class _JudgeCaller:
    def __init__(self, engine: "Engine", role: str, session_index: int) -> None:
        self.engine = engine
        self.role = role
        self.session_index = session_index
        self.calls = 0
        self.binding = engine.resolve_model(role, engine.roles[role].model)
        self.role_ir = engine.roles[role]

    async def __call__(self, user: str) -> str:
        r = self.role_ir
        # the same merged sampling fields as the role's session turns (engine._sampling)
        base, _ = self.engine._sampling(self.role, r, self.binding)
        call_index = self.calls
        self.calls += 1
        samp = Sampling(seed=derive_seed(self.engine.seed, "judge", self.session_index, call_index), **base)
        messages = []
        if r.system is not None:
            messages.append({"role": "system", "content": self.engine.render(r.system, dict(self.engine.params))})
        messages.append({"role": "user", "content": user})
        req = ChatRequest(messages=tuple(messages), sampling=samp, model=self.binding.weights, role=self.role,
                          session_index=self.session_index, call_index=call_index)
        result = await self.binding.backend.complete(req)
        return result.text


def _context(engine: "Engine", member: "SessionResult", role: str, group_ctx: dict) -> dict:
    """Template variables of a contest: parameters, the member session's variables (the
    group shares its prompt item), the group's rewards, and the role's first prompt."""
    return {**engine.params, **member.vars, **group_ctx, "prompt": member.first_prompts.get(role, "")}


async def _tournament(engine: "Engine", t: ir.Tournament, group_id: str, role: str, ok: list["SessionResult"],
                      group_ctx: dict, extra: dict) -> list[float | None]:
    """Runs the tournament; the fitted strengths and call count go into `extra` (stored
    with the group), the normalised scores are returned as the routed rewards."""
    from askspec.runtime.scoring.tournament import run_tournament

    caller = _JudgeCaller(engine, t.judge, ok[0].plan.index)
    ctx_base = _context(engine, ok[0], role, group_ctx)

    async def judge(first: str, second: str, attempt: int) -> str:
        return await caller(engine.render(t.template, {**ctx_base, "response_a": first, "response_b": second, "attempt": attempt}))

    traces = [m.final_texts.get(role, "") for m in ok]
    # a judge that keeps failing propagates: the engine records the group's route as error
    result = await run_tournament(traces, judge=judge, pairing=t.pairing, gamma=t.gamma, aggregate=t.aggregate, order=t.order,
                                  seed=derive_seed(engine.seed, group_id), retries=t.retries,
                                  anchors=t.live_opponents, labels=t.verdicts)
    for m in result.matches:
        engine.writer.match(group_id, a=ok[m.a].plan.session_id, b=ok[m.b].plan.session_id,
                            first_shown=ok[m.first_shown].plan.session_id if isinstance(m.first_shown, int) else str(m.first_shown),
                            verdict=m.verdict, outcome=m.outcome, raw=m.raw_reply)
    extra.update(strengths=list(result.strengths), judge_calls=result.judge_calls, aggregate=result.aggregate,
                 pairing=result.pairing)
    return list(result.scores)


async def _pointwise(engine: "Engine", j: ir.PointwiseJudge, role: str, ok: list["SessionResult"],
                     group_ctx: dict, extra: dict) -> list[float | None]:
    """Scores each member's final reply; the judge's raw replies go into `extra` (stored
    with the group) so a score can be checked against what the judge said."""
    from askspec.runtime.scoring.tournament import parse_pointwise

    caller = _JudgeCaller(engine, j.judge, ok[0].plan.index)
    out: list[float | None] = []
    replies: list[list[str]] = []
    for m in ok:
        ctx = {**_context(engine, m, role, group_ctx), "response": m.final_texts.get(role, "")}
        score = None
        said: list[str] = []
        for attempt in range(1 + j.retries):
            try:
                text = await caller(engine.render(j.template, {**ctx, "attempt": attempt}))
            except BackendError as e:
                said.append(f"error: {e}")
                break
            said.append(text)
            score = parse_pointwise(text, j.scores)
            if score is not None:
                break
        out.append(score)
        replies.append(said)
    extra.update(judge_replies=replies, judge_calls=caller.calls)
    return out
