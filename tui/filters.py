"""The sessions filter bar's little language, parsed into SQL conditions.

``status:ok,error outcome:too_easy game:calibrate group:g1* role:questioner
reward:0.2..1 "what is"`` keeps the sessions that match every term:

- ``status:`` ``outcome:`` ``game:`` ``group:`` — any of the comma-separated values
  (``*`` is a wildcard; ``-`` or ``none`` matches a missing value);
- ``role:R`` — sessions in which role R took a turn; it also names the role whose
  total reward ``reward:`` tests;
- ``reward:LO..HI`` — the session's total reward (of ``role:`` if given, else of all
  roles) within [LO, HI]; either end may be left out (``reward:0.5..``);
- ``step:N`` (or ``step:LO..HI``) — the training step the session was played for;
  ``stage:NAME`` — its stage (any of comma-separated names, as ``status:``);
- ``var:NAME=VALUE`` (``!=``, ``>``, ``>=``, ``<``, ``<=``) — a session variable (the
  spec's ``vars``): ``=``/``!=`` compare the text (``*`` wildcard; ``-`` = missing) or,
  for a number, the number; the others need a number;
- anything else — full-text search: each word or ``"quoted phrase"`` must occur
  (case-insensitively) in some turn text of the session.

Pure functions, no Textual: the data layer turns a ``Filter`` into SQL.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

FIELDS = ("status", "outcome", "game", "group", "role", "reward", "step", "stage", "var")
VAR_OPS = ("!=", ">=", "<=", "=", ">", "<")  # (two-character ones first: ``>=`` is not ``>`` then ``=``)


class FilterError(ValueError):
    """A filter term that cannot be understood; the message names it."""


@dataclass(frozen=True)
class VarTest:
    """``var:NAME<op>VALUE``: ``number`` is VALUE read as a number, when it is one."""

    name: str
    op: str
    value: str
    number: float | None


@dataclass
class Filter:
    status: list[str] = field(default_factory=list)
    outcome: list[str] = field(default_factory=list)
    game: list[str] = field(default_factory=list)
    group: list[str] = field(default_factory=list)
    role: str | None = None
    reward: tuple[float | None, float | None] | None = None
    step: tuple[float | None, float | None] | None = None
    stage: list[str] = field(default_factory=list)
    vars: list[VarTest] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.status or self.outcome or self.game or self.group or self.role
                    or self.reward or self.step or self.stage or self.vars or self.text)

    @property
    def needs_turns(self) -> bool:
        """Whether evaluating it scans the turns (slow on a large NDJSON run)."""
        return bool(self.text or self.role)


_RANGE = re.compile(r"^\s*(-?[0-9.eE+-]*)\s*\.\.\s*(-?[0-9.eE+-]*)\s*$")


def _number(s: str, term: str) -> float | None:
    if s == "":
        return None
    try:
        return float(s)
    except ValueError:
        raise FilterError(f"not a number in {term!r}: {s!r}") from None


def parse_filter(text: str) -> Filter:
    """Parse the filter bar's text; raises FilterError with a one-line message."""
    try:
        terms = shlex.split(text)
    except ValueError as e:  # an unclosed quote
        raise FilterError(f"cannot read the filter: {e}") from None
    f = Filter()
    for term in terms:
        key, sep, value = term.partition(":")
        key = key.lower()
        if not sep or key not in FIELDS:
            if term.strip():
                f.text.append(term)
            continue
        if value == "":
            raise FilterError(f"{key}: needs a value (e.g. {key}:{_EXAMPLE[key]})")
        if key == "role":
            f.role = value
        elif key in ("reward", "step"):
            m = _RANGE.match(value)
            if m:
                lo, hi = _number(m.group(1), term), _number(m.group(2), term)
            else:  # a single number: exactly that value
                lo = hi = _number(value, term)
            if lo is not None and hi is not None and lo > hi:
                raise FilterError(f"empty {key} range {value!r} (low end above high end)")
            setattr(f, key, (lo, hi))
        elif key == "var":
            f.vars.append(_var_test(value, term))
        else:
            getattr(f, key).extend(v for v in value.split(",") if v != "")
    return f


def _var_test(value: str, term: str) -> VarTest:
    m = _VAR.match(value)
    if not m:
        raise FilterError(f"{term!r}: write var:NAME=VALUE (or !=, >, >=, <, <=), e.g. var:{_EXAMPLE['var']}")
    name, op, rhs = m.group(1).strip(), m.group(2), m.group(3).strip()
    try:
        num: float | None = float(rhs)
    except ValueError:
        num = None
    if op not in ("=", "!=") and num is None:
        raise FilterError(f"{term!r}: {op} needs a number, not {rhs!r}")
    if rhs == "":
        raise FilterError(f"{term!r}: needs a value after {op}")
    return VarTest(name, op, rhs, num)


_VAR = re.compile(r"^([^=<>!\"]+)(" + "|".join(re.escape(o) for o in VAR_OPS) + r")(.*)$")

_EXAMPLE = {"status": "ok", "outcome": "too_easy", "game": "calibrate", "group": "g1",
            "role": "questioner", "reward": "0.5..1", "step": "3", "stage": "warmup", "var": "questions>2"}


def escape_like(value: str) -> str:
    """``value`` matched literally by LIKE with ``\\`` as the escape character."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def like_pattern(value: str) -> str:
    """A glob value (``*`` wildcard) as a LIKE pattern with ``\\`` as escape."""
    return escape_like(value).replace("*", "%")
