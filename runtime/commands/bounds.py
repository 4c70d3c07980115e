"""What one session of a game can spend, per role: the most model calls, prompt and
completion tokens the plan allows (`session_bounds`), and a comparison of what a run
spent with those bounds (`spent_vs_bounds`). `askspec estimate` (estimate.py) multiplies
them by a plan's sessions; `askspec run`'s closing summary compares them with what it
spent (`closing_lines`). They live apart from estimate.py, which imports run.py for its
pilot runs, so that run.py uses them without an import cycle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from askspec.ir import model as ir
from askspec.ir.vocab import SAMPLING_DEFAULTS
from askspec.ir.render import route_call_bounds
from askspec.terminal import printable


@dataclass
class Cell:
    """Calls, prompt and completion tokens of one (stage, game, role); None: no bound."""

    calls: float | None = 0
    prompt: float | None = 0
    completion: float | None = 0

    def add(self, other: "Cell") -> None:
        self.calls = _plus(self.calls, other.calls)
        self.prompt = _plus(self.prompt, other.prompt)
        self.completion = _plus(self.completion, other.completion)

    @property
    def tokens(self) -> float | None:
        return _plus(self.prompt, self.completion)


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


# ---------------------------------------------------------------------- per-call budgets

def completion_cap(exp: ir.Experiment, role: ir.Role, asks: Iterable[ir.AskStep] = ()) -> int:
    """The most completion tokens one call of `role` can take: its ask's `with sampling`,
    else the role's fields merged over its model's (ir.merged_sampling, the engine's rule);
    over every ask of the role in the game."""
    # a role bound per session (`bind`) may play any model: the largest budget of them
    defaults = exp.sampling_defaults or SAMPLING_DEFAULTS
    models = [exp.model(role.model)] if role.model else list(exp.models)
    samplings = [m.sampling for m in models if m is not None] or [{}]
    base = max(int(ir.merged_sampling(defaults, s, role)["max_tokens"]) for s in samplings)
    caps = [base]
    for a in asks:
        own = a.sampling_for(role.name).get("max_tokens")
        if isinstance(own, int):
            caps.append(own)
    return max(caps)


def prompt_cap(role: ir.Role) -> int | None:
    """The most prompt tokens one call of `role` can send, when the plan bounds it: a role
    that remembers nothing and caps its prompt (`max_prompt_tokens` with `prompt_overflow`);
    a remembering role's later prompts grow with the session (None)."""
    if role.max_prompt_tokens is not None and role.prompt_overflow is not None and role.memory.kind == "none":
        return role.max_prompt_tokens
    return None


def _asks(steps: list) -> Iterable[ir.AskStep]:
    from askspec.ir.walk import all_steps

    return (s for s in all_steps(steps) if isinstance(s, ir.AskStep))


def session_bounds(exp: ir.Experiment, game: ir.Game) -> dict[str, Cell]:
    """Per role, the most calls and tokens one session of `game` can spend, its routes'
    judge calls spread over the group's sessions."""
    roles = {r.name: r for r in exp.roles}
    asks = list(_asks(game.body))
    calls: dict[str, float] = {role: float(n) for role, n in game.call_bounds.items()}
    for role, per_group, _ in route_call_bounds(exp, game):
        calls[role] = calls.get(role, 0.0) + per_group / max(1, game.group_size)
    out = {}
    for name, n in calls.items():
        r = roles.get(name)
        if r is None:
            continue
        mine = [a for a in asks if name in a.roles]
        cap = prompt_cap(r)
        out[name] = Cell(n, None if cap is None else n * cap, n * completion_cap(exp, r, mine))
    return out


def count(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}"



def spent_vs_bounds(exp: ir.Experiment, sessions: dict[str, int],
                    spent: dict[str, Cell]) -> dict[str, tuple[Cell, Cell]]:
    """Per role: (what was spent, the bounds of the sessions played), for `sessions`
    (game -> sessions played) and `spent` (role -> calls and tokens); a game the spec no
    longer has is left out."""
    out: dict[str, tuple[Cell, Cell]] = {}
    games = {g.name: g for g in exp.games}
    for game, n in sessions.items():
        g = games.get(game)
        if g is None:
            continue
        for role, per in session_bounds(exp, g).items():
            bound = out.setdefault(role, (spent.get(role, Cell()), Cell()))[1]
            bound.add(Cell(*(None if v is None else n * v for v in (per.calls, per.prompt, per.completion))))
    return out


def versus(role: str, spent: Cell, bound: Cell) -> str:
    def one(what: str, v: float | None, b: float | None) -> str:
        return f"{what} {count(v)} " + ("(no bound)" if b is None else f"of ≤ {count(b)}")

    return (f"{role}: {one('calls', spent.calls, bound.calls)}, {one('prompt', spent.prompt, bound.prompt)}, "
            f"{one('completion', spent.completion, bound.completion)} tokens")


def closing_lines(exp: ir.Experiment, sessions: dict[str, int], spent: dict[str, list[int]]) -> list[str]:
    """`askspec run`'s closing summary: per role, what this process spent (`spent`: role ->
    [calls, tokens in, tokens out], the progress counts) beside the estimate's bounds of the
    sessions it played (`sessions`: game -> count)."""
    cells = {role: Cell(float(c), float(tin), float(tout)) for role, (c, tin, tout) in spent.items()}
    pairs = spent_vs_bounds(exp, sessions, cells)
    if not pairs:
        return []
    lines = ["  spent vs the estimate's bounds of these sessions (askspec estimate):"]
    lines += [f"    {versus(role, *pair)}" for role, pair in sorted(pairs.items())]
    return [printable(line, single_line=True) for line in lines]
