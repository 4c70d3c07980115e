"""Diagnostics as data, formatted once: `path:line:col: error[E123]: message`, the source
line, a caret under the span, then an optional hint.

Every diagnostic code the compiler can emit is registered in CODES (the language
reference lists them from here, and golden tests cover each one).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

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
    "E111": ("error", "invalid parameter override (--set)"),
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
    "W501": ("warning", "unused declaration"),
    "W502": ("warning", "unreachable statement"),
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

    def add(self, path: str, text: str) -> None:
        self._texts[path] = text

    def line(self, path: str, line: int) -> str | None:
        text = self._texts.get(path)
        if text is None:
            return None
        lines = text.splitlines()
        if 1 <= line <= len(lines):
            return lines[line - 1]
        return None


def _display(line: str) -> str:
    # Tabs and control characters would misplace the caret; show them as spaces/escapes.
    return "".join(ch if ch.isprintable() or ch == " " else (" " if ch == "\t" else "?") for ch in line)


def format_diagnostic(d: Diagnostic, sources: Sources) -> str:
    where = f"{d.span.file}:{d.span.line}:{d.span.col}: " if d.span else ""
    out = [f"{where}{d.severity}[{d.code}]: {d.message}"]
    if d.span is not None:
        src = sources.line(d.span.file, d.span.line)
        if src is not None:
            src = _display(src)
            if len(src) > 200:  # keep huge single-line inputs readable
                start = max(0, d.span.col - 80)
                src = src[start : start + 160]
                col = d.span.col - start
            else:
                col = d.span.col
            width = 1
            if d.span.end_line == d.span.line and d.span.end_col > d.span.col:
                width = d.span.end_col - d.span.col
            width = max(1, min(width, len(src) - col + 2))
            gutter = str(d.span.line)
            out.append(f" {gutter} | {src}")
            out.append(f" {' ' * len(gutter)} | {' ' * (col - 1)}{'^' * width}")
    for msg, span in d.notes:
        out.append(f"  note: {span}: {msg}")
    if d.hint:
        out.append(f"  hint: {d.hint}")
    return "\n".join(out)


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

    def emit(self, sources: Sources, stream=None) -> None:
        stream = stream or sys.stderr
        for d in self.sorted():
            print(format_diagnostic(d, sources), file=stream)
