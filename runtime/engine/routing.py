"""Group routing: once every session of a `sample N` group has finished, each route of
the game decides, from the group's rewards, whether the verifier rewards are kept, the
group is dropped (`resample`: dropped, and a training step plays another group in its
place), or the traces go to a pairwise tournament or a pointwise judge.

Routed rewards are stored next to the session rewards (name `tournament` / `judge`), and
the group records the route it took, its statistics, its members, how many judge calls it
made and how many of them gave no parseable verdict. A live tournament takes the traces in
the order they finish (`arrival_order`: by completion tokens), as Reasoning Arena's §4
admits each trace when it finishes; the group records that order (`arrival`). Routing reaches models only through
a `JudgeClient` (render a template, call a judge role and parse its reply), so it can be
run alone against a fake client; the engine's client records every call as a turn."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from askspec.ir import model as ir

from askspec.runtime.backends.base import BackendError
from askspec.runtime.engine.evaluator import Env, evaluate
from askspec.runtime.engine.plan import derive_seed
from askspec.runtime.engine.recorder import Recorder
from askspec.runtime.engine.state import SessionResult
from askspec.runtime.scoring.tournament import group_stats, parse_pointwise, parse_verdict, run_tournament


@dataclass
class JudgeReply:
    text: str
    value: Any  # the parsed verdict or score; None when the reply held none


class JudgeClient(Protocol):
    """What routing needs from the engine to consult a judge role."""

    def render(self, template: str, ctx: dict[str, Any]) -> str:
        """Render a spec template (key into the IR's templates) with `ctx`."""
        ...

    async def call(self, role: str, prompt: str, parse: Callable[[str], Any], *, group_id: str, session_index: int,
                   call_index: int) -> JudgeReply:
        """One call of the judge role; `parse` reads its verdict (None: none). Raises
        BackendError when the call itself fails for good."""
        ...


@dataclass
class JudgeTally:
    """The judge calls one route arm made for one group, and how many gave no verdict
    (an unparseable reply or a failed call)."""

    game: str
    route_role: str  # the role whose rewards the route replaced
    contest: str  # "tournament arena" / "judge rlaif"
    judge: str  # the judge role
    calls: int = 0
    unparsed: int = 0

    @property
    def failing(self) -> bool:
        return self.calls > 0 and 2 * self.unparsed > self.calls


class _Judge:
    """One contest's calls to its judge role; the call numbers seed the calls."""

    def __init__(self, client: JudgeClient, role: str, group_id: str, session_index: int,
                 parse: Callable[[str], Any], tally: JudgeTally) -> None:
        self.client, self.role, self.group_id, self.session_index = client, role, group_id, session_index
        self.parse, self.tally = parse, tally

    async def __call__(self, prompt: str) -> JudgeReply:
        index = self.tally.calls
        self.tally.calls += 1
        try:
            reply = await self.client.call(self.role, prompt, self.parse, group_id=self.group_id,
                                           session_index=self.session_index, call_index=index)
        except BackendError:
            self.tally.unparsed += 1
            raise
        if reply.value is None:
            self.tally.unparsed += 1
        return reply


def arrival_order(members: list[SessionResult]) -> list[int]:
    """The order in which a group's traces finish, as indices into `members`: by the
    session's completion tokens (a group's traces are decoded side by side, so the shorter
    finishes first; Reasoning Arena §4: "short traces first"), ties in sample order. A
    deterministic stand-in for the finish time, which a replay or a resumed run could not
    reproduce; in a one-ask game (Reasoning Arena's `solve`) it is the trace's own length."""
    return sorted(range(len(members)), key=lambda i: (members[i].tokens, members[i].plan.index))


def role_total(res: SessionResult, role: str) -> float:
    return float(sum(v for r, _, _, v in res.rewards if r == role))


class GroupRouter:
    """Routes finished groups of one experiment, recording through `recorder`."""

    def __init__(self, exp: ir.Experiment, params: dict[str, Any], seed: int, recorder: Recorder,
                 judges: JudgeClient) -> None:
        self.exp, self.params, self.seed, self.recorder, self.judges = exp, params, seed, recorder, judges
        self.games = {g.name: g for g in exp.games}

    async def route(self, group_id: str, members: list[SessionResult]) -> list[JudgeTally]:
        """Route one group; a failing route is recorded on the group (route `error`) and
        the run goes on. Returns the judge tallies of the arms that called a judge."""
        tallies: list[JudgeTally] = []
        try:
            await self._route(group_id, members, tallies)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.recorder.group(group_id, route="error", stats={"error": f"{e.__class__.__name__}: {e}"},
                                members=[m.plan.session_id for m in members], **_counts(tallies))
        return tallies

    async def _route(self, group_id: str, members: list[SessionResult], tallies: list[JudgeTally]) -> None:
        game = self.games[members[0].plan.game]
        ok = sorted((m for m in members if m.status == "ok"), key=lambda m: m.plan.index)
        ids = [m.plan.session_id for m in ok]
        if not game.routes:
            self.recorder.group(group_id, route="none", stats={"count": 0}, members=ids)
            return
        for route in game.routes:
            rewards = [role_total(m, route.role) for m in ok]
            env = Env(vars={"rewards": rewards, "size": len(rewards)}, params=self.params)
            arm = next((a for a in route.arms if a.cond is None or evaluate(a.cond, env)), None)
            stats = {**(group_stats(rewards) if rewards else {"count": 0}), "role": route.role}
            if arm is None or arm.action in ("keep", "drop", "resample") or not ok:
                action = "keep" if arm is None else arm.action
                self.recorder.group(group_id, route=action, stats=stats, members=ids)
                continue
            group_ctx = {"role": route.role, "rewards": rewards, "size": len(rewards)}
            extra: dict = {}
            tally = JudgeTally(game.name, route.role, f"{arm.action} {arm.target}", "")
            tallies.append(tally)
            if arm.action == "tournament":
                t = next(t for t in self.exp.tournaments if t.name == arm.target)
                tally.judge = t.judge
                scores = await self._tournament(t, group_id, route.role, ok, group_ctx, extra, tally)
                name = "tournament"
            else:
                j = next(j for j in self.exp.judges if j.name == arm.target)
                tally.judge = j.judge
                scores = await self._pointwise(j, group_id, route.role, ok, group_ctx, extra, tally)
                name = "judge"
            for m, score in zip(ok, scores):
                if score is not None:
                    self.recorder.reward(m.plan.session_id, m.attempt, role=route.role, turn_index=None, name=name,
                                         value=float(score), kind="terminal")
            self.recorder.group(group_id, route=f"{arm.action}:{arm.target}",
                                stats={**stats, **extra, "routed": list(scores)}, members=ids, **_counts([tally]))

    def _context(self, member: SessionResult, role: str, group_ctx: dict) -> dict:
        """Template variables of a contest: parameters, the member session's variables (the
        group shares its prompt item), the group's rewards, and the role's first prompt."""
        return {**self.params, **member.vars, **group_ctx, "prompt": member.first_prompts.get(role, "")}

    async def _tournament(self, t: ir.Tournament, group_id: str, role: str, ok: list[SessionResult],
                          group_ctx: dict, extra: dict, tally: JudgeTally) -> list[float | None]:
        """Runs the tournament; the fitted strengths and call count go into `extra` (stored
        with the group), the normalised scores are returned as the routed rewards."""
        labels = tuple(t.verdicts)
        judge = _Judge(self.judges, t.judge, group_id, ok[0].plan.index, lambda text: parse_verdict(text, labels), tally)
        ctx_base = self._context(ok[0], role, group_ctx)

        async def ask(first: str, second: str, attempt: int) -> str:
            prompt = self.judges.render(t.template, {**ctx_base, "response_a": first, "response_b": second,
                                                     "attempt": attempt})
            return (await judge(prompt)).text

        arrived = arrival_order(ok) if t.pairing == "live" else list(range(len(ok)))
        traces = [ok[i].final_texts.get(role, "") for i in arrived]
        # a judge call that fails for good propagates: the group's route is recorded as error
        result = await run_tournament(traces, judge=ask, pairing=t.pairing, gamma=t.gamma, aggregate=t.aggregate,
                                      order=t.order, seed=derive_seed(self.seed, group_id), retries=t.retries,
                                      anchors=t.live_opponents, labels=t.verdicts)
        for m in result.matches:
            shown = m.first_shown
            self.recorder.match(group_id, a=ok[arrived[m.a]].plan.session_id, b=ok[arrived[m.b]].plan.session_id,
                                first_shown=ok[arrived[shown]].plan.session_id if isinstance(shown, int) else str(shown),
                                verdict=m.verdict, outcome=m.outcome, raw=m.raw_reply)
        scores: list[float | None] = [None] * len(ok)
        strengths: list[float] = [0.0] * len(ok)
        for k, i in enumerate(arrived):  # back to the members' order (sample order)
            scores[i], strengths[i] = result.scores[k], float(result.strengths[k])
        extra.update(strengths=strengths, judge_calls=result.judge_calls, aggregate=result.aggregate,
                     pairing=result.pairing, arrival=[ok[i].plan.session_id for i in arrived])
        return scores

    async def _pointwise(self, j: ir.PointwiseJudge, group_id: str, role: str, ok: list[SessionResult],
                         group_ctx: dict, extra: dict, tally: JudgeTally) -> list[float | None]:
        """Scores each member's final reply; the judge's raw replies go into `extra` (stored
        with the group) so a score can be checked against what the judge said."""
        scores = list(j.scores)
        judge = _Judge(self.judges, j.judge, group_id, ok[0].plan.index, lambda text: parse_pointwise(text, scores), tally)
        out: list[float | None] = []
        replies: list[list[str]] = []
        for m in ok:
            ctx = {**self._context(m, role, group_ctx), "response": m.final_texts.get(role, "")}
            score = None
            said: list[str] = []
            for attempt in range(1 + j.retries):
                try:
                    reply = await judge(self.judges.render(j.template, {**ctx, "attempt": attempt}))
                except BackendError as e:
                    said.append(f"error: {e}")
                    break
                said.append(reply.text)
                score = reply.value
                if score is not None:
                    break
            out.append(score)
            replies.append(said)
        extra.update(judge_replies=replies, judge_calls=tally.calls)
        return out


def _counts(tallies: list[JudgeTally]) -> dict[str, int]:
    if not tallies:
        return {}
    return {"judge_calls": sum(t.calls for t in tallies), "unparsed": sum(t.unparsed for t in tallies)}
