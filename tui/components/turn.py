"""One turn of a transcript as text — who, which model, tokens, latency, finish reason;
what it was sent and from whom; the reply with its parsed sections highlighted
(forwarded sections, the graded ``\\boxed{}``); its rewards; the prompt as sent — and
``TurnBlock``: a turn's texts wrapped into lines for a width, which the worker that reads
the transcript builds so that the UI thread only draws them (``TranscriptView``)."""

from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass, field

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from askspec.terminal import printable
from askspec.tui.numbers import number
from askspec.tui.shaping import Highlight, Turn

# Styles with their own background read on light and dark themes alike.
FORWARDED = "bold black on #e5c07b"
ANSWER = "bold black on #98c379"
SECTION = "underline"
SENT_LINES = 6


def styled_reply(text: str, highlights: list[Highlight], forwarded: set[str]) -> Text:
    """The reply, control characters escaped, parsed sections styled by what they are."""
    points = sorted({0, len(text), *(h.start for h in highlights), *(h.end for h in highlights)})
    out = Text()
    pos: dict[int, int] = {}
    for p, q in zip(points, points[1:]):
        pos[p] = len(out)
        out.append(printable(text[p:q]))
    pos[len(text)] = len(out)
    for h in highlights:
        style = ANSWER if h.label == "answer" else FORWARDED if h.label in forwarded else SECTION
        out.stylize(style, pos[h.start], pos[h.end])
    return out


def _cut(text: str, lines: int) -> str:
    rows = text.splitlines()
    if len(rows) <= lines:
        return text
    return "\n".join(rows[:lines]) + f"\n… ({len(rows) - lines} more lines; the full prompt is below)"


def header(turn: Turn) -> Text:
    t = Text()
    t.append(f"t{turn.index} ", style="bold")
    t.append(printable(turn.role, single_line=True), style="bold cyan")
    if turn.model:
        t.append(f"  {printable(turn.model, single_line=True)}", style="dim")
    if turn.tokens_in is not None or turn.tokens_out is not None:
        t.append(f"  tokens {turn.tokens_in if turn.tokens_in is not None else '?'}→"
                 f"{turn.tokens_out if turn.tokens_out is not None else '?'}")
    if turn.latency_ms is not None:
        ms = turn.latency_ms
        t.append(f"  {ms:.0f} ms" if ms < 1000 else f"  {ms / 1000:.1f} s")
    if turn.finish_reason:
        t.append(f"  {printable(turn.finish_reason, single_line=True)}",
                 style="bold red" if turn.finish_reason == "length" else "")
    if turn.recovery:
        t.append("  ⟲ recovery", style="bold magenta")
    if not turn.parsed.get("parsed", True):
        t.append("  ✗ unparsed", style="bold red")
    if turn.error:
        t.append(f"  error: {printable(turn.error, single_line=True)}", style="bold red")
    for name, value in turn.rewards:
        t.append(f"  reward {printable(name, single_line=True)}={number(value, sign=True)}", style="bold green")
    return t


def prompt_text(turn: Turn) -> Text:
    t = Text()
    for i, m in enumerate(turn.prompt):
        role = m.get("role", "?") if isinstance(m, dict) else "?"
        content = m.get("content", "") if isinstance(m, dict) else m
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        if i:
            t.append("\n")
        t.append(f"[{printable(str(role), single_line=True)}]\n", style="bold")
        t.append(printable(content))
    return t or Text("(no prompt recorded)", style="dim")


def body(turn: Turn) -> Text:
    """Everything about the turn but its prompt, as one text."""
    parts = [header(turn)]
    if turn.sent is not None:
        sent = Text("← sent", style="bold")
        if turn.received_from:
            sent.append(" (" + ", ".join(f"{printable(r, single_line=True)} t{i} {f}"
                                         for r, i, f in turn.received_from) + ")")
        sent.append(": ")
        sent.append(printable(_cut(turn.sent, SENT_LINES)))
        sent.stylize("dim")
        parts.append(sent)
    forwarded = {f for _r, _i, f in turn.forwarded_to}
    parts.append(styled_reply(turn.text, turn.highlights, forwarded) if turn.text
                 else Text("(no reply)", style="dim"))
    links = Text(style="dim")
    labels = [h.label for h in turn.highlights]
    if labels:
        links.append("parsed: " + ", ".join(dict.fromkeys(labels)))
        answer = turn.parsed.get("answer")
        if isinstance(answer, str):
            links.append(f"   answer: {printable(answer, single_line=True)}")
    if turn.forwarded_to:
        links.append(("\n" if links else "") + "→ forwarded to " + ", ".join(
            f"{printable(r, single_line=True)} t{i} ({f})" for r, i, f in turn.forwarded_to))
    if links:
        parts.append(links)
    for path, chars, file in turn.stored_aside:
        parts.append(Text(f"✂ {printable(path, single_line=True)} is cut here: {chars:,} characters, whole in "
                          f"events/{printable(file, single_line=True)}", style="bold yellow"))
    return Text("\n").join(parts)


def prompt_line(turn: Turn, open_: bool) -> Text:
    """The prompt's first line: a marker that says whether it is open, and its size."""
    return Text(f"{'▼' if open_ else '▶'} prompt ({len(turn.prompt)} messages)", style="bold")


Lines = list[list[Segment]]


_local = threading.local()


def wrap(text: Text, width: int) -> Lines:
    """``text`` wrapped to ``width`` cells, as lines of segments. Safe in a worker thread:
    each thread renders on a console of its own (the app's belongs to the UI thread)."""
    console = getattr(_local, "console", None)
    if console is None:
        console = _local.console = Console(file=io.StringIO(), color_system="truecolor", force_terminal=True,
                                           legacy_windows=False, highlight=False, markup=False, emoji=False)
    return console.render_lines(text, console.options.update_width(max(width, 1)), pad=False)


@dataclass
class TurnBlock:
    """A turn as the transcript view draws it: its texts and, per width, their lines
    (the body; the prompt closed and open). The prompt's open lines are wrapped when it is
    first opened."""

    turn: Turn
    kind: str  # "", "recovery" or "failed": the colour of the turn's left border
    body: Text
    _lines: dict[tuple[str, int], Lines] = field(default_factory=dict)

    @classmethod
    def of(cls, turn: Turn) -> "TurnBlock":
        kind = "recovery" if turn.recovery else "failed" if (turn.error or not turn.ok) else ""
        return cls(turn, kind, body(turn))

    def lines(self, part: str, width: int) -> Lines:
        """The lines of ``part`` ("body", "prompt" closed, "prompt-open") at ``width``."""
        key = (part, width)
        got = self._lines.get(key)
        if got is None:
            if part == "body":
                text = self.body
            elif part == "prompt":
                text = prompt_line(self.turn, False)
            else:
                text = Text("\n").join([prompt_line(self.turn, True), prompt_text(self.turn)])
            got = self._lines[key] = wrap(text, width)
        return got

    def prepare(self, width: int) -> "TurnBlock":
        """Wrap what is shown first (the body and the closed prompt) at ``width``."""
        self.lines("body", width)
        self.lines("prompt", width)
        return self
