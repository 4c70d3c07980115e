"""Diagnostics as data, formatted once: `path:line:col: error[E123]: message`, the source
line, a caret under the span, then an optional hint.

Every diagnostic code the compiler can emit is registered in CODES (the language
reference lists them from here, and golden tests cover each one).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

from .terminal import printable
from .span import Span

Severity = Literal["error", "warning"]

# code -> (severity, one-line description used by docs/language.md)
CODES: dict[str, tuple[Severity, str]] = {
    "E001": ("error", "syntax error: unexpected token"),
    "E002": ("error", "unexpected end of file (an unclosed block, bracket or string)"),
    "E003": ("error", "invalid character"),
    "E004": ("error", "file cannot be read or is not valid UTF-8 text"),
    "E005": ("error", "input too large or nested too deeply"),
    "E006": ("error", "number out of range (not a finite number)"),
    "E101": ("error", "undefined name"),
    "E102": ("error", "unknown role"),
    "E103": ("error", "unknown model"),
    "E104": ("error", "duplicate declaration"),
    "E105": ("error", "unknown attribute for this kind of block"),
    "E106": ("error", "missing required attribute"),
    "E107": ("error", "invalid attribute value"),
    "E108": ("error", "unknown function"),
    "E109": ("error", "wrong number or kind of arguments"),
    "E110": ("error", "unknown template, data set, buffer, tournament, judge or game"),
    "E111": ("error", "invalid override (--set, --data)"),
    "E112": ("error", "unknown profile"),
    "E113": ("error", "profile overrides something the spec does not declare"),
    "E114": ("error", "nothing to run: the spec declares no game"),
    "E201": ("error", "type mismatch"),
    "E202": ("error", "unknown field of a record or reply"),
    "E203": ("error", "unknown outcome"),
    "E301": ("error", "template uses a variable the protocol does not provide"),
    "E302": ("error", "template syntax error"),
    "E303": ("error", "template or data file not found"),
    "E304": ("error", "file refused: outside the spec's folder, not a regular file, or too large"),
    "E305": ("error", "template breaks the sandbox: a forbidden attribute, a change to data, or work past the render limits"),
    "E401": ("error", "unbounded loop"),
    "E402": ("error", "trained role without a reward on some path"),
    "E403": ("error", "role has no model on some path"),
    "E404": ("error", "statement not allowed here"),
    "E405": ("error", "invalid training configuration"),
    "E406": ("error", "buffer eviction that cannot be carried out"),
    "E407": ("error", "update gate that is not a yes/no over the step's sessions"),
    "E408": ("error", "invalid stage list"),
    "E409": ("error", "variable read on a path where it has no value"),
    # compile --target openrlhf: what an OpenRLHF 0.11.2 job cannot express (docs/cluster.md)
    "E601": ("error", "training algorithm the target lacks"),
    "E602": ("error", "schedule the target cannot express"),
    "E603": ("error", "trained role with several trajectories per session"),
    "E604": ("error", "training setting the target cannot map"),
    "E605": ("error", "buffer replayed across a run"),
    "E606": ("error", "trained role without trainable weights"),
    "E607": ("error", "nothing to train"),
    "E608": ("error", "trained roles whose names the job's files and shell variables cannot tell apart"),
    "E609": ("error", "sequence length (max_len) above the trained model's context"),
    "W601": ("warning", "stage the target's job leaves out"),
    # askspec rescore: a changed spec must keep the protocol the recorded run was played with
    "E701": ("error", "rescore: the spec changes the protocol the recorded run was played with"),
    # compile --target verifiers: what a verifiers 0.4.0 environment cannot express
    "E702": ("error", "verifiers: several trained roles"),
    "E703": ("error", "verifiers: nested schedule"),
    "E704": ("error", "verifiers: stages"),
    "E705": ("error", "verifiers: game replaying a buffer filled during the run"),
    "E706": ("error", "verifiers: group route"),
    "E707": ("error", "verifiers: role that cannot be a field of the environment's config"),
    "E708": ("error", "verifiers: reward depending on earlier sessions (diversity, novelty)"),
    "E709": ("error", "verifiers: role on a python or replay model"),
    "W501": ("warning", "unused declaration"),
    "W502": ("warning", "unreachable statement"),
    "W503": ("warning", "more planned sessions than the limit (1,000,000)"),
    "W504": ("warning", "quantize on a trained role's model (applies to --eval-only runs only)"),
    "E999": ("error", "internal compiler error (please report it)"),
}


@dataclass
class Diagnostic:
    code: str
    message: str
    span: Span | None
    hint: str | None = None
    notes: list[tuple[str, Span]] = field(default_factory=list)

    @property
    def severity(self) -> Severity:
        return CODES[self.code][0]

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


class Sources:
    """File texts by path, used to print the source line under a diagnostic."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self._lines: dict[str, list[str]] = {}  # split once: a diagnostic per line must not re-split the file

    def add(self, path: str, text: str) -> None:
        self._texts[path] = text
        self._lines.pop(path, None)

    def line(self, path: str, line: int) -> str | None:
        lines = self._lines.get(path)
        if lines is None:
            text = self._texts.get(path)
            if text is None:
                return None
            lines = self._lines[path] = text.splitlines()
        if 1 <= line <= len(lines):
            return lines[line - 1]
        return None


def _shown(text: str) -> str:
    # Tabs become one space (so columns still count characters); every other control
    # character is escaped, so a spec cannot drive the terminal through a diagnostic.
    return printable(text.replace("\t", " "), single_line=True)


def format_diagnostic(d: Diagnostic, sources: Sources) -> str:
    where = f"{d.span.file}:{d.span.line}:{d.span.col}: " if d.span else ""
    out = [_shown(f"{where}{d.severity}[{d.code}]: {d.message}")]
    if d.span is not None:
        src = sources.line(d.span.file, d.span.line)
        if src is not None:
            col = d.span.col
            if len(src) > 200:  # keep huge single-line inputs readable
                start = max(0, col - 80)
                src = src[start : start + 160]
                col -= start
            width = 1
            if d.span.end_line == d.span.line and d.span.end_col > d.span.col:
                width = d.span.end_col - d.span.col
            width = max(1, min(width, len(src) - col + 2))
            # the caret goes under the escaped text: measure what precedes and what it covers
            before, covered = _shown(src[: col - 1]), _shown(src[col - 1 : col - 1 + width])
            gutter = str(d.span.line)
            out.append(f" {gutter} | {_shown(src)}")
            out.append(f" {' ' * len(gutter)} | {' ' * len(before)}{'^' * max(1, len(covered))}")
    for msg, span in d.notes:
        out.append(_shown(f"  note: {span}: {msg}"))
    if d.hint:
        out.append(_shown(f"  hint: {d.hint}"))
    return "\n".join(out)


MAX_PRINTED = 100  # diagnostics printed per file by default (`--max-diagnostics`)


class DiagnosticSink:
    """Collects diagnostics from every pass; passes never raise for user errors."""

    def __init__(self) -> None:
        self.items: list[Diagnostic] = []

    def error(self, code: str, message: str, span: Span | None, hint: str | None = None) -> Diagnostic:
        d = Diagnostic(code, message, span, hint)
        self.items.append(d)
        return d

    warn = error  # severity comes from the code's registration

    @property
    def has_errors(self) -> bool:
        return any(d.is_error for d in self.items)

    def sorted(self) -> list[Diagnostic]:
        def key(d: Diagnostic):
            s = d.span
            return (s.file, s.line, s.col) if s else ("", 0, 0)

        seen: set[tuple] = set()
        out = []
        for d in sorted(self.items, key=key):
            k = (d.code, d.message, d.span)
            if k not in seen:
                seen.add(k)
                out.append(d)
        return out

    def emit(self, sources: Sources, stream=None, limit: int | None = MAX_PRINTED) -> None:
        """Print the diagnostics in source order, at most ``limit`` of them (None or 0:
        all; when some are left out, errors come before warnings), then one line counting
        the rest."""
        stream = stream or sys.stderr
        shown = self.sorted()
        if limit and len(shown) > limit:  # errors first when not all fit
            shown = [d for d in shown if d.is_error] + [d for d in shown if not d.is_error]
        rest = shown[limit:] if limit else []
        for d in shown[:limit] if limit else shown:
            print(format_diagnostic(d, sources), file=stream)
        if rest:
            errors = sum(d.is_error for d in rest)
            kinds = ", ".join(f"{n:,} {w}{'s' if n != 1 else ''}" for n, w in
                              ((errors, "error"), (len(rest) - errors, "warning")) if n)
            print(f"... and {len(rest):,} more ({kinds}) not shown; --max-diagnostics 0 shows all", file=stream)
