"""Answer equivalence: is answer ``a`` the same as answer ``b``?

This module owns the `equiv` built-in of the spec language and the Ask-E scoring rule
(App. F "Scoring details"): "Equivalence is checked with the math-verify library,
preceded by a normalization pass that strips \\boxed, \\text/\\mathrm wrappers, math
delimiters, \\left/\\right pairs, and LaTeX spacing commands. If symbolic verification
fails we fall through to whitespace- and case-insensitive string equality,
comma-separated set equality (for reordered solution sets), and text-only fuzzy matching
for "no solution" synonyms."

`equiv` never raises and never hangs, whatever it is given:

* inputs are coerced to text (None and empty answers never match anything);
* a pair longer than `MAX_INPUT_CHARS` only gets the exact (whitespace/case-insensitive)
  string comparison; the symbolic stage only sees short, structurally tame expressions
  (`symbolic_safe`: length, bracket depth, no exponent towers, no huge factorials or
  powers -- the inputs that make sympy compute for minutes in C code);
* the symbolic stage runs under a wall-clock deadline that works on ANY thread (see
  `_Watchdog`): math-verify's own timeout uses ``signal.alarm``, which raises
  ValueError off the main thread and clobbers any other SIGALRM user (pytest-timeout,
  the host app), so we call math-verify with ``parsing_timeout=None`` /
  ``timeout_seconds=None`` (documented there as "no signal handling; handle the
  timeout yourself") and enforce the deadline ourselves;
* results are cached (``functools.lru_cache``) on raw pairs and on normalised pairs.

Symmetry decision: math-verify's ``verify(gold, target)`` is deliberately asymmetric
(assignments like ``x=2`` and equation/interval conversions are only unpacked on one
side). In Ask-E both sides are model answers -- the "key" is just another model -- so
there is no privileged gold. `equiv(a, b)` is True when math-verify accepts EITHER
direction, which makes `equiv` symmetric (``equiv(a, b) == equiv(b, a)``, relied on by
the outcome rule and by the cache key).
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import logging
import os
import re
import threading
import time
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, Callable, TypeVar

__all__ = [
    "equiv",
    "normalize",
    "is_no_solution",
    "symbolic_safe",
    "split_top_level",
    "cache_clear",
    "DeadlineExceeded",
    "call_with_deadline",
    "SYMBOLIC_TIMEOUT_S",
    "MAX_INPUT_CHARS",
    "MAX_SYMBOLIC_CHARS",
]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- limits (the guards)

# Above this, a side is not an "answer" any more (answers are a few to a few hundred
# characters): compare it only as a squashed string, in linear time.
MAX_INPUT_CHARS = 4_000
# The symbolic stage sees only expressions up to this long; math-verify on a 1,000-char
# sum of 150 terms already takes ~2 s.
MAX_SYMBOLIC_CHARS = 300
# Bracket nesting beyond this makes the LaTeX parser recurse for seconds (300 levels:
# ~6 s) -- no real answer nests this deep.
MAX_NESTING = 12
# Wall-clock budget for the whole symbolic stage of one pair (parse both sides, verify
# both directions). Cold calls take 1-70 ms; this only bites on pathological input.
SYMBOLIC_TIMEOUT_S = 3.0
# Comma-set fallback: at most this many elements per side (pairwise matching is
# quadratic and each element comparison may be symbolic).
MAX_SET_ELEMENTS = 12


# ---------------------------------------------------------------- deadline (any thread)


class DeadlineExceeded(Exception):
    """Raised by `call_with_deadline` when the callable ran past its budget."""


class _Deadline(BaseException):
    # BaseException, not Exception: sympy and math-verify wrap a lot of code in
    # `except Exception`, which would swallow the interrupt and keep computing.
    pass


RESIGNAL_S = 0.25  # a fired job not yet disarmed is fired again after this (see _Watchdog)


class _Job:
    __slots__ = ("tid", "state")

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.state = "armed"  # armed -> fired | done


class _Watchdog:
    """One daemon thread that interrupts over-budget computations on any thread.

    Interruption uses CPython's ``PyThreadState_SetAsyncExc``: the target thread raises
    `_Deadline` at its next bytecode boundary. That is exactly the guarantee a SIGALRM
    handler gives (signals too are only acted on between bytecodes), without being tied
    to the main thread. Long single C calls (a 10^9-digit power) cannot be interrupted by
    either mechanism; `symbolic_safe` keeps those out.

    Arming and firing happen under one lock, and disarming clears a fired-but-not-yet-
    delivered exception, so an interrupt can never escape the guarded call.

    A fired job that is still not disarmed `RESIGNAL_S` later is fired again (until it is
    disarmed): CPython keeps one interpreter-wide "an asynchronous exception is pending"
    flag, and another thread consuming its own exception at the same moment clears it, so
    the target can spin on without ever looking at its pending exception (seen once: a
    guarded pure-Python loop ran for the test's whole 900 s). A thread that did take the
    exception disarms within microseconds, long before a second firing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Job]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self.pid = os.getpid()
        api = getattr(ctypes, "pythonapi", None)
        self.available = False  # not CPython: guards only
        if api is not None:
            try:
                self._set = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
                    ("PyThreadState_SetAsyncExc", api)
                )
                # Same C function, but able to pass NULL (= clear the pending exception).
                self._clear = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
                    ("PyThreadState_SetAsyncExc", api)
                )
                self.available = True
            except (AttributeError, TypeError, OSError):
                pass

    def arm(self, seconds: float) -> _Job:
        job = _Job(threading.get_ident())
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="askspec-equiv-watchdog", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), job))
            self._cond.notify()
        return job

    def disarm(self, job: _Job) -> None:
        with self._cond:
            if job.state == "fired":
                self._clear(job.tid, None)
            job.state = "done"

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self._heap and self._heap[0][2].state == "done":
                    heapq.heappop(self._heap)
                if not self._heap:
                    cond.wait()
                    continue
                deadline, _, job = self._heap[0]
                now = time.monotonic()
                if now < deadline:
                    cond.wait(deadline - now)
                    continue
                heapq.heappop(self._heap)
                if job.state in ("armed", "fired"):
                    self._set(job.tid, _Deadline)
                    job.state = "fired"
                    heapq.heappush(self._heap, (now + RESIGNAL_S, next(self._seq), job))


_WATCHDOG: _Watchdog | None = None


def _watchdog() -> _Watchdog:
    """The process's watchdog, made on first use (importing this module changes nothing
    in the process: no thread, no fork handler); a forked child makes its own, since the
    parent's thread does not exist there and its lock may have been copied held. (Two
    threads racing here may make two; each caller arms and disarms on the one it got.)"""
    global _WATCHDOG
    wd = _WATCHDOG
    if wd is None or wd.pid != os.getpid():
        wd = _WATCHDOG = _Watchdog()
    return wd


T = TypeVar("T")


def call_with_deadline(fn: Callable[[], T], seconds: float | None) -> T:
    """Run ``fn()`` on the calling thread; raise DeadlineExceeded after ``seconds``.

    Works on the main thread, worker threads and inside a running asyncio loop (it
    blocks the caller like any sync call; use ``asyncio.to_thread`` to keep a loop
    responsive). ``seconds`` None/<=0, or a non-CPython interpreter: no deadline.
    """
    if not seconds or seconds <= 0:
        return fn()
    wd = _watchdog()
    if not wd.available:
        return fn()
    job: _Job | None = None
    try:
        job = wd.arm(seconds)
        try:
            return fn()
        finally:
            wd.disarm(job)
    except _Deadline:
        if job is not None:  # (a second firing landing before the finally's disarm: never fired again)
            wd.disarm(job)
        raise DeadlineExceeded(f"exceeded {seconds:g} s") from None


# ---------------------------------------------------------------- normalisation

_WRAPPERS = (
    "boxed", "fbox", "text", "textrm", "textbf", "textit", "textnormal", "mathrm",
    "mathbf", "mathit", "mathsf", "mbox",
)
_WRAPPER_RX = re.compile(r"\\(" + "|".join(_WRAPPERS) + r")(?![A-Za-z])\s*\{")


def _unwrap(s: str) -> str:
    """Replace ``\\boxed{X}``, ``\\text{X}``, ``\\mathrm{X}``... by X, nesting-aware.

    One left-to-right pass with a stack: a wrapper's opening brace pushes "drop", any
    other brace pushes "keep"; a closing brace is emitted only if its opener was kept.
    Escaped braces are literal. A wrapper whose brace never closes is put back verbatim:
    ``\\boxed{12`` (a reply cut off mid-answer) must not turn into a clean ``12``.
    """
    if "\\" not in s:
        return s
    out: list[str] = []
    # (dropped?, index in `out` where the wrapper would have been, wrapper text)
    stack: list[tuple[bool, int, str]] = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch == "\\":
            m = _WRAPPER_RX.match(s, i)
            if m:
                stack.append((True, len(out), m.group(0)))
                out.append("")  # placeholder, filled back in if never closed
                i = m.end()
                continue
            out.append(s[i : i + 2])
            i += 2
            continue
        if ch == "{":
            stack.append((False, len(out), ch))
            out.append(ch)
        elif ch == "}":
            if stack:
                if not stack.pop()[0]:
                    out.append(ch)
            else:
                out.append(ch)
        else:
            out.append(ch)
        i += 1
    for dropped, index, literal in stack:
        if dropped:
            out[index] = literal
    return "".join(out)


_DELIMS_RX = re.compile(r"\$\$|\\\$|\$|\\\(|\\\)|\\\[|\\\]")
_LEFTRIGHT_RX = re.compile(r"\\(?:left|right|[Bb]igg?[lr]?)(?![A-Za-z])\s*\.?")
_THIN_SPACE_RX = re.compile(r"\\[,;:!]")
_WIDE_SPACE_RX = re.compile(r"\\(?:q?quad|enspace|thinspace|medspace|thickspace|hspace\{[^{}]*\})(?![A-Za-z])|\\ |~")
_DISPLAY_RX = re.compile(r"\\(?:displaystyle|textstyle|scriptstyle)(?![A-Za-z])")
_WS_RX = re.compile(r"\s+")
_TRAIL_RX = re.compile(r"[\s.]+$")
_UNICODE_MAP = str.maketrans({
    "\u2212": "-", "\u2013": "-", "\u00a0": " ", "\u2009": " ", "\u202f": " ",
    "∞": "\\infty ", "≤": "\\le ", "≥": "\\ge ", "≠": "\\ne ", "×": "\\times ", "·": "\\cdot ",
})


def normalize(s: str) -> str:
    """Ask-E's normalisation pass (App. F), in this order:

    1. unicode minus/dashes -> ``-``, non-breaking/thin spaces -> space, ``∞ ≤ ≥ ≠ × ·``
       -> their LaTeX commands;
    2. unwrap ``\\boxed{}``/``\\fbox{}`` and ``\\text{}``/``\\mathrm{}`` (and the
       ``\\textbf``/``\\mathbf``/``\\mbox``... family) -- content kept, nesting-aware;
    3. drop math delimiters ``$$ $ \\$ \\( \\) \\[ \\]``;
    4. drop ``\\left``/``\\right`` (and ``\\bigl``/``\\Bigr``...), including the
       invisible ``\\left.``/``\\right.``;
    5. drop thin spacing ``\\, \\; \\: \\!`` (so ``1\\,000`` -> ``1000``) and turn wide
       spacing ``\\quad \\qquad \\␣ ~`` into a space; drop ``\\displaystyle``;
    6. ``\\varnothing`` -> ``\\emptyset``; collapse whitespace; strip; drop trailing
       periods.
    """
    s = s.translate(_UNICODE_MAP)
    s = _unwrap(s)
    s = _DELIMS_RX.sub("", s)
    s = _LEFTRIGHT_RX.sub("", s)
    s = _THIN_SPACE_RX.sub("", s)
    s = _WIDE_SPACE_RX.sub(" ", s)
    s = _DISPLAY_RX.sub("", s)
    s = s.replace("\\varnothing", "\\emptyset")
    s = _WS_RX.sub(" ", s).strip()
    s = _TRAIL_RX.sub("", s)
    return s


def _squash(s: str) -> str:
    """Whitespace- and case-insensitive form used by the string-equality fallback."""
    return _WS_RX.sub("", s).casefold()


# ---------------------------------------------------------------- "no solution"

_NO_SOLUTION_EXACT = frozenset({
    "none", "nosolution", "nosolutions", "∅", "\\emptyset", "emptyset", "{}", "\\{\\}",
    "theemptyset", "dne", "d.n.e", "doesnotexist", "nonexistent",
    "noanswer", "noreal", "nothing",
})
_NO_SOLUTION_RX = re.compile(
    r"^(?:"
    r"(?:there\s+(?:is|are|exists?)\s+)?no\s+(?:(?:real|integer|integral|natural|rational|"
    r"positive|negative|valid|such|possible|finite|complex|nonzero|non-zero|solution)\s+)*"
    r"(?:solutions?|answers?|values?|roots?|numbers?|integers?|pairs?|triples?|x|n|"
    r"such\s+\w+|real\s+\w+)(?:\s+exists?)?"
    r"|(?:it|they|the\s+\w+|this|such\s+\w+|a\s+solution|the\s+solution)?\s*"
    r"(?:does|do)\s*(?:not|n't)\s+exist"
    r"|(?:the\s+)?(?:solution\s+set\s+is\s+)?(?:the\s+)?empty(?:\s+set)?"
    r"|none(?:\s+exists?)?"
    r"|not\s+exist(?:s|ent)?"
    r")$"
)


def is_no_solution(s: str) -> bool:
    """True when a (normalised) answer says "there is no solution" in some form.

    Text-only and deliberately narrow: the whole answer must be one of the synonyms
    ("no solution", "no real solutions", "none", "∅", "\\emptyset", "{}", "does not
    exist", "DNE", "the empty set", ...), case/space-insensitive. Anything containing a
    digit is never a synonym ("no solution for x > 2" is a different answer), and plain
    "no" is not one (it is a yes/no answer).
    """
    if not s or len(s) > 80 or any(ch.isdigit() for ch in s):
        return False
    t = s.casefold().strip().rstrip(".!")
    t = t.replace("’", "'")
    if _WS_RX.sub("", t) in _NO_SOLUTION_EXACT:
        return True
    return bool(_NO_SOLUTION_RX.match(_WS_RX.sub(" ", t)))


# ---------------------------------------------------------------- guards

_NESTED_EXP_RX = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\(?[\w.]+\)?\s*\^|\*\*\s*\(?[\w.]+\)?\s*\*\*")
_BIG_INT_RX = re.compile(r"\d{6,}")
_GROWTH_RX = re.compile(r"\^|\*\*|!|\\binom|\\choose|\\dbinom|\\tbinom|\\prod|\\sum")
_TEXTLIKE_RX = re.compile(r"[A-Za-z][A-Za-z\s,'’-]*")
_MATH_WORDS = frozenset({"pi", "oo", "inf", "infty", "infinity", "e", "i"})


def _nesting_depth(s: str) -> int:
    depth = best = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            best = max(best, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return best


def symbolic_safe(s: str) -> bool:
    """Whether ``s`` may go through sympy at all (the static half of the guard).

    Rejected: longer than MAX_SYMBOLIC_CHARS; bracket nesting deeper than MAX_NESTING;
    exponent towers (``a^{b^c}``, ``a^b^c``, ``a**b**c`` -- ``9^{9^9}`` never finishes);
    and any integer of 6+ digits next to growth operators (``^``, ``!``, binomials,
    sums/products: ``2^{1000000000}`` takes 17 s); factorials next to powers
    (``10^{10}!`` takes 6 s, deadline or not). These are
    long C computations the deadline cannot interrupt. Such answers still get the string,
    set and no-solution fallbacks.
    """
    if len(s) > MAX_SYMBOLIC_CHARS or _nesting_depth(s) > MAX_NESTING:
        return False
    if _NESTED_EXP_RX.search(s):
        return False
    if _GROWTH_RX.search(s) and _BIG_INT_RX.search(s):
        return False
    if "!" in s and ("^" in s or "**" in s):  # (10^{10})!: a factorial of a power
        return False
    return True


def _text_like(s: str) -> bool:
    # Plain words ("yes", "red", "north east") are not algebra: math-verify would read
    # "no" as n*o and call it equal to "on". Single letters and math names stay symbolic.
    return bool(_TEXTLIKE_RX.fullmatch(s)) and _WS_RX.sub("", s).lower() not in _MATH_WORDS and len(
        _WS_RX.sub("", s)
    ) > 1


# ---------------------------------------------------------------- math-verify

_mv: Any = None
_mv_lock = threading.Lock()


class _DropNoTimeoutWarning(logging.Filter):
    # We disable math-verify's signal timeouts on purpose (see module docstring); its
    # one-time "Timeout is disabled ..." warning would only mislead whoever reads logs.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


def _math_verify() -> Any:
    """Import math-verify lazily (sympy import costs ~1 s) and once."""
    global _mv
    if _mv is None:
        with _mv_lock:
            if _mv is None:
                import math_verify  # noqa: PLC0415

                for name in ("math_verify.parser", "math_verify.grader"):
                    logging.getLogger(name).addFilter(_DropNoTimeoutWarning())
                _mv = (
                    math_verify,
                    [math_verify.LatexExtractionConfig()],
                    [math_verify.ExprExtractionConfig()],
                )
    return _mv


@lru_cache(maxsize=16_384)
def _mv_parse(s: str) -> tuple[Any, ...]:
    """math-verify's parse of one normalised answer (cached: the key is reused a lot).

    The normalisation pass removed the math delimiters, so the text is re-wrapped in
    ``$...$`` for the LaTeX extractor (bare LaTeX is not reliably extracted: ``\\sqrt{2}``
    alone parses to nothing); if that yields nothing, the plain-expression extractor
    gets the bare text (``1/2``, ``0.5``).
    """
    mv, latex_cfg, expr_cfg = _math_verify()
    res = mv.parse("$" + s + "$", latex_cfg, parsing_timeout=None)
    if not res:
        res = mv.parse(s, expr_cfg, parsing_timeout=None)
    return tuple(res)


def _symbolic(a: str, b: str) -> bool:
    mv = _math_verify()[0]

    def run() -> bool:
        pa, pb = list(_mv_parse(a)), list(_mv_parse(b))
        if not pa or not pb:
            return False
        return bool(
            mv.verify(pb, pa, timeout_seconds=None) or mv.verify(pa, pb, timeout_seconds=None)
        )

    try:
        return call_with_deadline(run, SYMBOLIC_TIMEOUT_S)
    except DeadlineExceeded:
        log.warning("equiv: symbolic check timed out after %g s; treating as not equal", SYMBOLIC_TIMEOUT_S)
        return False
    except Exception:  # math-verify is not supposed to raise, but equiv must not
        log.debug("equiv: math-verify raised", exc_info=True)
        return False


# ---------------------------------------------------------------- set fallback

_OUTER_SET_RX = re.compile(r"^(?:\\\{(.*)\\\}|\{(.*)\})$", re.S)


def split_top_level(s: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside any (), [], {} group; elements are stripped."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(s):
        # Escaped \{ \} count as brackets too: "\{1,2\}, 3" has two elements.
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append(s[start:i].strip())
            start = i + 1
    parts.append(s[start:].strip())
    return parts


def _set_elements(s: str) -> list[str]:
    m = _OUTER_SET_RX.match(s.strip())
    if m:
        inner = m.group(1) if m.group(1) is not None else m.group(2)
        # Only unwrap when the braces really enclose the whole string ("{1}+{2}" no).
        if _balanced(inner):
            s = inner
    return [e for e in split_top_level(s) if e]


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _set_equal(a: str, b: str) -> bool:
    ea, eb = _set_elements(a), _set_elements(b)
    if len(ea) != len(eb) or len(ea) < 2 or len(ea) > MAX_SET_ELEMENTS:
        return False
    if sorted(map(_squash, ea)) == sorted(map(_squash, eb)):
        return True
    # Greedy matching is exact here because element equivalence is (near enough) an
    # equivalence relation; each element comparison is the full check without sets.
    unused = list(eb)
    for x in ea:
        for k, y in enumerate(unused):
            if _core(x, y, allow_sets=False):
                del unused[k]
                break
        else:
            return False
    return True


# ---------------------------------------------------------------- equiv


def _core(a: str, b: str, allow_sets: bool = True) -> bool:
    """The decision on two normalised, non-empty answers.

    The paper's chain is an OR (math-verify, else string, else set, else no-solution);
    we evaluate the cheap members first -- the result is the same. The only extra rule:
    a no-solution synonym matches only another synonym, and plain words never go through
    math-verify (see `_text_like`).
    """
    if _squash(a) == _squash(b):
        return True
    na, nb = is_no_solution(a), is_no_solution(b)
    if na or nb:
        return na and nb
    if not (_text_like(a) or _text_like(b)) and symbolic_safe(a) and symbolic_safe(b):
        if _symbolic(a, b):
            return True
    if allow_sets and _set_equal(a, b):
        return True
    return False


@lru_cache(maxsize=65_536)
def _equiv_normalised(a: str, b: str) -> bool:
    # Called with (a, b) in sorted order, so the cache is shared by both argument orders.
    return _core(a, b)


def _to_text(x: Any) -> str | None:
    if x is None:
        return None
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        # repr(1e-07) is "1e-07", which math-verify reads as e*(-7): write it out.
        try:
            return format(Decimal(repr(x)), "f") if x == x and abs(x) != float("inf") else repr(x)
        except (InvalidOperation, ValueError):
            return repr(x)
    if isinstance(x, (bytes, bytearray)):
        return bytes(x).decode("utf-8", errors="replace")
    try:
        return str(x)
    except Exception:
        return None


@lru_cache(maxsize=65_536)
def _equiv_raw(a: str, b: str) -> bool:
    na, nb = normalize(a), normalize(b)
    if not na or not nb:
        return False
    if nb < na:
        na, nb = nb, na
    return _equiv_normalised(na, nb)


def equiv(a: Any, b: Any) -> bool:
    """True when answers ``a`` and ``b`` are equivalent (Ask-E's rule; symmetric).

    Steps: coerce to text (None -> no match; numbers written out in full), normalise
    (`normalize`); empty after normalisation -> no match; then True if any of:
    whitespace/case-insensitive string equality; both are "no solution" synonyms
    (`is_no_solution`); math-verify accepts the pair in either direction (skipped for
    plain words and for inputs `symbolic_safe` rejects; bounded by SYMBOLIC_TIMEOUT_S);
    comma-separated set equality, order-insensitive, each element compared with the same
    check minus the set rule. Never raises; safe on any thread and inside asyncio.
    """
    try:
        ta, tb = _to_text(a), _to_text(b)
        if ta is None or tb is None:
            return False
        if len(ta) > MAX_INPUT_CHARS or len(tb) > MAX_INPUT_CHARS:
            # Not an answer any more; linear comparison, and kept out of the cache so a
            # few megabyte-sized replies cannot pin memory.
            sa, sb = _squash(ta), _squash(tb)
            return bool(sa) and sa == sb
        if tb < ta:
            ta, tb = tb, ta
        return _equiv_raw(ta, tb)
    except RecursionError:
        return False
    except Exception:  # last line of defence: a scoring bug must not kill a session
        log.exception("equiv failed on a pair; treating as not equal")
        return False


def parses_as_math(answer: Any) -> bool:
    """Whether math-verify extracts something from `answer` (SOAR's format filter: "a
    boxed answer parseable by math-verify"); never raises, bounded like `equiv`."""
    text = _to_text(answer)
    if text is None:
        return False
    norm = normalize(text)
    if not norm or len(norm) > MAX_SYMBOLIC_CHARS or not symbolic_safe(norm):
        return False
    try:
        return bool(call_with_deadline(lambda: _mv_parse(norm), SYMBOLIC_TIMEOUT_S))
    except BaseException as e:  # deadline or a parser failure: not parseable
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False


def cache_clear() -> None:
    """Forget cached results (tests and benchmarks)."""
    _equiv_raw.cache_clear()
    _equiv_normalised.cache_clear()
    _mv_parse.cache_clear()
