"""What `askspec run` shows while it works: one line per model being prepared, then one
progress line (sessions done/total, sessions/s, tokens/s, ETA, outcome counts),
rewritten in place on a terminal and printed every few seconds otherwise."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Callable, TextIO

from askspec.terminal import printable


class Progress:
    def __init__(self, total: int, already: int, quiet: bool, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = already
        self.start_done = already
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.monotonic()
        self.tokens = 0
        self.outcomes: Counter = Counter()
        self._last = 0.0
        self._printed_done = -1

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

    # ------------------------------------------------------------------ sessions
    def planned(self, n: int) -> None:
        """A later phase (a game replaying a buffer) added n sessions."""
        self.total += n

    def turn(self, tokens: int) -> None:
        self.tokens += tokens
        self.maybe_print()

    def session(self, res) -> None:
        self.done += 1
        self.outcomes["error" if res.status == "error" else (res.outcome or "ok")] += 1
        self.maybe_print(force=not self.tty and self.done == self.total)

    def line(self) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        rate = (self.done - self.start_done) / dt
        left = self.total - self.done
        eta = f"{left / rate:,.0f}s" if rate > 0 else "?"
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items()))
        text = (f"sessions {self.done:,}/{self.total:,}  {rate:.2f} sess/s  {self.tokens / dt:,.1f} tok/s  ETA {eta}"
                + (f"  [{counts}]" if counts else ""))
        return printable(text, single_line=True)  # outcomes come from the spec and model replies

    def maybe_print(self, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        interval = 0.25 if self.tty else 5.0
        if not force and now - self._last < interval:
            return
        self._last = now
        self._write()

    def _write(self) -> None:
        self._printed_done = self.done
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

    def close(self) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line() + "\n")
            self.stream.flush()
        elif self._printed_done != self.done:  # not the same line twice
            self._write()
