"""What a session carries while it runs and what it leaves behind, as typed records.

The spec's own variables (`vars`) are kept apart from the engine's bookkeeping
(`SessionBook`: stateful-function calls, buffer pushes, turns dropped from training), so
the store's queryable `sessions.vars` column holds only what the spec named, and a resumed
run or a trainer reads the bookkeeping from a column of its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from askspec.runtime.backends.base import Backend
from askspec.runtime.engine.evaluator import RoleView
from askspec.runtime.engine.plan import SessionPlan

# (role, turn index or None for a terminal reward, reward name, value)
Reward = tuple[str, "int | None", str, float]


class EndSession(Exception):
    def __init__(self, outcome: str | None) -> None:
        self.outcome = outcome


class SessionFailed(Exception):
    """A session cannot go on (model call failed for good, bad expression, replay ran out)."""


class RunAborted(Exception):
    """Something in a session raised a BaseException that is not an error of the session
    (SystemExit or KeyboardInterrupt from a python callable, GeneratorExit): the run stops.
    Raised as an ordinary exception so it reaches the command through the engine's awaits
    instead of escaping the event loop; `cause` is the original."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}{f': {cause}' if str(cause) else ''}")
        self.cause = cause


class Reply(dict):
    """A model's reply as the spec sees it: a dict of the parser's fields, `parsed`,
    `truncated`, `finish_reason`, `tokens`, `role`, `model` and `text`. What the engine
    keeps about it are attributes, not keys a spec could read or iterate: `turn`, the
    turn's index in its session (what `reward ... for r` and `drop ... r` name), and
    `missing`, the fields the parser did not find (a recovery prompt's `missing`)."""

    __slots__ = ("turn", "missing")

    def __init__(self, fields: dict[str, Any], *, turn: int, missing: list[str]) -> None:
        super().__init__(fields)
        self.turn = turn
        self.missing = missing


@dataclass
class ModelBinding:
    name: str  # declared model name or "backend:weights"
    backend: Backend
    weights: str  # what the backend is asked for (weights, or the model a server serves)
    sampling: dict[str, Any]
    label: str = ""  # what `turns.model` records (default: name); "served@endpoint" for servers
    max_tokens_cap: int | None = None  # --max-tokens: no call on this binding asks for more (a role's or an ask's budget included)

    def capped(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A call's merged sampling fields under the --max-tokens cap: the one place the cap
        is applied (the model's, the role's and an ask's budgets are merged first)."""
        if self.max_tokens_cap is not None and "max_tokens" in fields:
            fields["max_tokens"] = min(int(fields["max_tokens"]), self.max_tokens_cap)
        return fields


@dataclass
class StatefulCall:
    """One call of a stateful built-in (diversity, novelty): replayed into the run-level
    histories when a run resumes."""

    fn: str
    site: str
    text: str
    kwargs: dict[str, Any]


@dataclass
class DroppedTurns:
    """`drop`: turns of `role` excluded from training (None: every turn of the role)."""

    role: str
    turns: list[int] | None


@dataclass
class SessionBook:
    """The engine's bookkeeping of one session, recorded beside (never inside) its vars."""

    stateful: list[StatefulCall] = field(default_factory=list)
    pushes: list[tuple[str, Any]] = field(default_factory=list)  # (buffer, JSON value), in push order
    dropped: list[DroppedTurns] = field(default_factory=list)

    def to_json(self) -> dict[str, Any] | None:
        """The store's `bookkeeping` column (None when there is nothing to keep)."""
        if not (self.stateful or self.pushes or self.dropped):
            return None
        return {"stateful": [[c.fn, c.site, c.text, c.kwargs] for c in self.stateful],
                "pushes": [[b, v] for b, v in self.pushes],
                "dropped": [{"role": d.role, "turns": d.turns} for d in self.dropped]}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SessionBook:
        data = data or {}
        return cls(stateful=[StatefulCall(fn, site, text, dict(kwargs or {})) for fn, site, text, kwargs in data.get("stateful") or []],
                   pushes=[(b, v) for b, v in data.get("pushes") or []],
                   dropped=[DroppedTurns(d["role"], d.get("turns")) for d in data.get("dropped") or []])

    @classmethod
    def from_legacy_vars(cls, vars_: dict[str, Any]) -> SessionBook:
        """Runs recorded before the bookkeeping column kept it in `vars` under dunder
        names; those are removed from `vars_`."""
        return cls.from_json({"stateful": vars_.pop("__stateful__", None), "pushes": vars_.pop("__pushes__", None),
                              "dropped": vars_.pop("__dropped__", None)})


@dataclass
class SharedTurn:
    """A turn of a shared conversation (`memory = shared(NAME)`): its speaker, the message
    the speaker was sent (which only the speaker sees again) and its reply. `ask` numbers
    the ask step it came from, `turn` its turn index: turns of one ask (`ask a, b`) are
    unseen by each other and ordered as the spec names the roles."""

    ask: int
    turn: int
    speaker: str
    prompt: str
    text: str
    # the user message the speaker was sent when its prompt was cut to max_prompt_tokens
    # (truncate_left): the others' tagged turns before it and its prompt, joined and cut
    # from the left; the speaker's later prompts carry that message as it was sent
    sent: str | None = None


@dataclass
class SessionState:
    """A running session: the spec's variables, each role's view and conversation, and
    the engine's counters and bookkeeping."""

    plan: SessionPlan
    attempt: int
    vars: dict[str, Any]
    roles: dict[str, RoleView]
    history: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    system: dict[str, str] = field(default_factory=dict)
    bound: dict[str, str] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    turn_counter: int = 0
    outcome: str | None = None
    rewards: list[Reward] = field(default_factory=list)
    tokens: int = 0
    first_user: dict[str, str] = field(default_factory=dict)
    book: SessionBook = field(default_factory=SessionBook)
    stateful: Callable[[str, str, list, dict], Any] | None = None
    sample_asks: int = 0  # `sample N ask`s so far: names each sample's trajectory in rollouts
    asks: int = 0  # ask steps begun so far (SharedTurn.ask)
    shared: dict[str, list[SharedTurn]] = field(default_factory=dict)  # conversation -> its turns, in order


@dataclass
class SessionResult:
    """A finished session, as group routing, buffers and resume need it."""

    plan: SessionPlan
    status: str  # ok | error
    outcome: str | None = None
    error: str | None = None
    rewards: list[Reward] = field(default_factory=list)
    final_texts: dict[str, str] = field(default_factory=dict)  # each role's last reply
    tokens: int = 0
    first_prompts: dict[str, str] = field(default_factory=dict)  # each role's first user message
    attempt: int = 1
    vars: dict[str, Any] = field(default_factory=dict)
    book: SessionBook = field(default_factory=SessionBook)

    @classmethod
    def of(cls, st: SessionState, status: str, error: str | None) -> SessionResult:
        """The result of a session that ran here. An errored session's pushes and drops
        are not kept: its buffer items never enter a buffer."""
        book = st.book if status == "ok" else SessionBook(stateful=st.book.stateful)
        return cls(plan=st.plan, status=status, outcome=st.outcome, error=error, rewards=st.rewards,
                   final_texts={r: v.turns[-1]["text"] for r, v in st.roles.items() if v.turns},
                   tokens=st.tokens, first_prompts=dict(st.first_user), attempt=st.attempt, vars=st.vars, book=book)

    def slim(self) -> SessionResult:
        """Without transcripts and variables: what a long run keeps per finished session."""
        return SessionResult(plan=self.plan, status=self.status, outcome=self.outcome, error=self.error,
                             rewards=self.rewards, tokens=self.tokens, attempt=self.attempt,
                             book=SessionBook(pushes=self.book.pushes))

    @property
    def pushes(self) -> list[tuple[str, Any]]:
        return self.book.pushes
