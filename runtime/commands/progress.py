"""What `askspec run` shows while it works and when it ends: one line per step of getting
the models ready (a one-time conversion apart from the load), then one progress line
(sessions done/total, sessions/s, generated tokens/s, ETA, outcome counts), rewritten in
place on a terminal and printed every few seconds otherwise, and a closing summary.

Tokens are counted as backends generate them (per token on the hf backend, through
`ChatRequest.on_tokens`), not when a turn ends, and a timer refreshes the line while no
session finishes; rates count from the first session, not from the start of the
process (loading a model is not generation)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import Counter
from typing import Callable, TextIO

from askspec.terminal import printable

# a role whose replies did not parse, or were cut at max_tokens, in more than this share of
# its calls gets a warning after the summary (frozen roles and judges too)
REPLY_WARN_SHARE = 0.1


class Progress:
    def __init__(self, total: int, already: int, quiet: bool, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = already
        self.start_done = already
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()  # the process began its work (preparation included)
        self.t0 = self.started  # the first session began (see begin)
        self.ended: float | None = None  # the sessions ended (close): rates stop counting there
        self.tokens = 0  # generated so far, streamed or counted at the end of a call
        self._tokens_lock = threading.Lock()  # backends report from their own threads
        self.turns = 0
        self.roles: dict[str, list[int]] = {}  # role -> [calls, tokens in, tokens out]
        self.replies: dict[str, list[int]] = {}  # role -> [unparsed, truncated, both] replies
        self.outcomes: Counter = Counter()  # the line's counts: outcome, or "error"
        self.statuses: Counter = Counter()  # (status, outcome) for the summary
        self.games: Counter = Counter()  # game -> sessions played (the summary's estimate bounds)
        self._last = 0.0
        self._printed: tuple[int, int] = (-1, -1)  # (done, tokens) of the last line printed

    # ------------------------------------------------------------------ preparing
    def step(self, text: str) -> Callable[[str], None]:
        """Start a line about a preparation step ("preparing model ... "); the function
        returned ends it (" ready in 3.1 s"). One line either way, whatever happens."""
        if self.quiet:
            return lambda _end: None
        self.stream.write(printable(text, single_line=True))
        self.stream.flush()

        def end(suffix: str) -> None:
            self.stream.write(printable(suffix, single_line=True) + "\n")
            self.stream.flush()

        return end

    def begin(self) -> None:
        """The sessions start now: rates count from here."""
        self.t0 = time.monotonic()

    # ------------------------------------------------------------------ sessions
    def planned(self, n: int) -> None:
        """A later phase (a game replaying a buffer) added n sessions."""
        self.total += n

    def stream_tokens(self, n: int) -> None:
        """n tokens generated (from any thread, while a call runs)."""
        with self._tokens_lock:
            self.tokens += n

    def turn(self, role: str, tokens_in: int, tokens_out: int, streamed: int = 0, unparsed: bool = False,
             truncated: bool = False) -> None:
        """A recorded call; `streamed` of its tokens_out were already counted as they came;
        whether its reply did not parse and whether it was cut at max_tokens."""
        self.turns += 1
        per = self.roles.get(role)
        if per is None:
            per = self.roles[role] = [0, 0, 0]
            self.replies[role] = [0, 0, 0]
        per[0] += 1
        per[1] += tokens_in
        per[2] += tokens_out
        if unparsed or truncated:
            bad = self.replies[role]
            bad[0] += unparsed
            bad[1] += truncated
            bad[2] += unparsed and truncated
        if tokens_out > streamed:  # what the backend did not report while it ran
            self.stream_tokens(tokens_out - streamed)
        self.maybe_print()

    def session(self, res) -> None:
        self.done += 1
        self.outcomes["error" if res.status == "error" else (res.outcome or "ok")] += 1
        self.statuses[(res.status, res.outcome)] += 1
        self.games[res.plan.game] += 1
        self.maybe_print(force=not self.tty and self.done == self.total)

    def line(self) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        rate = (self.done - self.start_done) / dt
        left = self.total - self.done
        eta = f"{left / rate:,.0f}s" if rate > 0 else "?"
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items()))
        text = (f"sessions {self.done:,}/{self.total:,}  turns {self.turns:,}  {rate:.2f} sess/s  "
                f"{self.tokens / dt:,.1f} tok/s  ETA {eta}" + (f"  [{counts}]" if counts else ""))
        return printable(text, single_line=True)  # outcomes come from the spec and model replies

    # seconds between refreshes of the line: a terminal's, a log's (a line each, so fewer)
    TTY_INTERVAL_S = 0.25
    LOG_INTERVAL_S = 5.0

    def interval(self) -> float:
        return self.TTY_INTERVAL_S if self.tty else self.LOG_INTERVAL_S

    def maybe_print(self, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        interval = self.interval()
        if not force and now - self._last < interval:
            return
        if not self.tty and not force and self._printed == (self.done, self.tokens):
            return  # a log gets a line when something changed
        self._last = now
        self._write()

    async def tick(self) -> None:
        """Refresh the line while calls run but no session ends (cancel to stop)."""
        interval = self.interval()
        while True:
            await asyncio.sleep(interval)
            self.maybe_print()

    def _write(self) -> None:
        self._printed = (self.done, self.tokens)
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line())
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def warn(self, message: str) -> None:
        """A warning line, shown even with --quiet (on a terminal, above the progress line)."""
        self.stream.write(("\r\x1b[2K" if self.tty and not self.quiet else "")
                          + f"warning: {printable(message, single_line=True)}\n")
        self.stream.flush()

    def note(self, line: str) -> None:
        """A line of its own (a training step's), above the progress line on a terminal
        (which is drawn again below it); nothing with --quiet."""
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + line + "\n" + self.line())
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        self.ended = time.monotonic()
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line() + "\n")
            self.stream.flush()
        elif self._printed[0] != self.done:  # not the same line twice
            self._write()

    # ------------------------------------------------------------------ the end
    def summary(self, status: str, run_dir: str) -> list[str]:
        """The closing lines: sessions by status and outcome, tokens in/out per role, wall
        time, generated tokens/s, the run directory (all of this process's work)."""
        now = time.monotonic()
        wall, playing = now - self.started, max((self.ended or now) - self.t0, 1e-9)
        played = self.done - self.start_done
        by_status: dict[str, Counter] = {}
        for (st, outcome), n in self.statuses.items():
            by_status.setdefault(st, Counter())[outcome] += n
        parts = []
        for st in sorted(by_status, key=lambda s: (s != "ok", s)):
            outcomes = by_status[st]
            named = ", ".join(f"{o} {n:,}" for o, n in sorted(outcomes.items(), key=lambda kv: str(kv[0])) if o)
            parts.append(f"{st} {sum(outcomes.values()):,}" + (f" ({named})" if named else ""))
        before = f"; {self.start_done:,} finished by an earlier process" if self.start_done else ""
        lines = [f"summary: run {status} after {wall:,.1f} s ({self.t0 - self.started:,.1f} s preparing, "
                 f"{playing:,.1f} s playing)",
                 f"  sessions: {played:,} played" + (f": {'; '.join(parts)}" if parts else "") + before]
        if self.roles:
            tin = sum(v[1] for v in self.roles.values())
            tout = sum(v[2] for v in self.roles.values())
            per = "; ".join(f"{role} {v[1]:,} in / {v[2]:,} out ({v[0]:,} calls)" for role, v in sorted(self.roles.items()))
            lines.append(f"  tokens: {per}; total {tin:,} in / {tout:,} out")
            lines.append(f"  replies: {self._replies()}")
        lines.append(f"  speed: {self.tokens / playing:,.1f} generated tok/s, {played / playing:,.2f} sessions/s")
        lines.append(f"  run directory: {run_dir}")
        return [printable(line, single_line=True) for line in lines]  # role and outcome names, paths

    def _replies(self) -> str:
        """Per role, the replies that did not parse and those cut at max_tokens."""
        parts = []
        for role, (unparsed, truncated, both) in sorted(self.replies.items()):
            calls = self.roles[role][0]
            if unparsed:
                cut = f" ({both:,} truncated)" if both else ""
                extra = f", {truncated - both:,} more truncated" if truncated - both else ""
                parts.append(f"{role} {unparsed:,} of {calls:,} unparsed{cut}{extra}")
            elif truncated:
                parts.append(f"{role} {truncated:,} of {calls:,} truncated")
        return "; ".join(parts) if parts else "every reply parsed, none truncated"

    def warnings(self, warned: frozenset[str] = frozenset()) -> list[str]:
        """A warning per role (trained or not, judges included) whose replies did not parse,
        or were cut at max_tokens, in more than REPLY_WARN_SHARE of its calls; `warned`: the
        judge roles whose missing verdicts the run's routes warn about already."""
        out = []
        for role, (unparsed, truncated, both) in sorted(self.replies.items()):
            calls = self.roles[role][0]
            said = unparsed > REPLY_WARN_SHARE * calls
            if said and role not in warned:
                cut = (f" ({both:,} of them cut at max_tokens: raise the role's max_tokens)" if both
                       else "; check its prompt against its reply format")
                out.append(f"{role}: {unparsed:,} of {calls:,} replies did not parse{cut}")
            cut_only = truncated - both if said else truncated  # those the warning above did not name
            if cut_only > REPLY_WARN_SHARE * calls:
                more = " more" if said and both else ""
                out.append(f"{role}: {cut_only:,}{more} of {calls:,} replies were cut at max_tokens; raise the role's "
                           f"max_tokens if they are meant to end")
        return [printable(line, single_line=True) for line in out]
