"""``TranscriptView``: a session's turns drawn with Textual's Line API, one widget for the
whole transcript.

Each turn is a ``TurnBlock`` (``components.turn``) whose lines the worker that read the
transcript has already wrapped to the view's width; the view keeps a flat list of the
lines on screen (each turn: its body, its prompt line(s), a blank line) and draws only
the visible ones, a left border in the turn's colour (recovery, failed) before each.
Mounting a widget per turn (a box, its text, its prompt line) made Textual style and lay
out three widgets a turn before the first paint; here, opening a transcript or adding
a running session's new turns is a list append and one refresh.

The prompt as sent is one line until opened: ``toggle_prompts`` opens or closes every
prompt, a click on a prompt line opens or closes that one."""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from askspec.tui.components.guard import Guarded
from askspec.tui.components.turn import Lines, TurnBlock

BORDER = "▎"  # (the glyph of Textual's "wide" left border)
GUTTER = 2  # the vertical scrollbar's columns, kept whether it shows or not
INDENT = 4  # " ▎ " before a line and " " after it (the widget has no padding of its own)


def text_width(view_width: int) -> int:
    """The width turns are wrapped to in a view ``view_width`` cells wide."""
    return max(10, view_width - GUTTER - INDENT)


class TranscriptView(Guarded, ScrollView, can_focus=True):
    """A transcript's turns (see the module docstring)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "transcript--turn", "transcript--recovery", "transcript--failed",
        "transcript--prompt", "transcript--prompt-hover", "transcript--note",
    }
    DEFAULT_CSS = """
    TranscriptView { height: 1fr; scrollbar-gutter: stable; padding: 0; }
    TranscriptView > .transcript--turn { color: $primary; }
    TranscriptView > .transcript--recovery { color: $warning; }
    TranscriptView > .transcript--failed { color: $error; }
    TranscriptView > .transcript--prompt { color: $text-muted; }
    TranscriptView > .transcript--prompt-hover { color: $text; }
    TranscriptView > .transcript--note { color: $text-muted; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.blocks: list[TurnBlock] = []
        self.note = ""  # shown when there are no turns ("no turns recorded ...")
        self._open: set[int] = set()  # blocks whose prompt is open
        self._width = 0  # the text width the lines below are wrapped to
        self._lines: list[tuple[int, str, list[Segment]]] = []  # (block, part, segments)
        self._starts: list[int] = []  # each block's first line
        self._strips: dict[tuple[int, bool], Strip] = {}
        self._styles: dict[str, Style] = {}
        self.hover_block: int | None = None  # whose prompt line the mouse is over

    # ------------------------------------------------------------------ data

    @property
    def wrap_width(self) -> int:
        """The text width for the view's current size (or the app's, before layout)."""
        width = self.size.width or (self.app.size.width if self.is_attached else 0)
        return text_width(width)

    def clear(self, note: str = "") -> None:
        self.blocks = []
        self._open = set()
        self.note = note
        self._relayout()
        self.scroll_to(y=0, animate=False, immediate=True)

    def set_note(self, note: str) -> None:
        if note != self.note:
            self.note = note
            if not self.blocks:
                self._relayout()

    def add(self, blocks: list[TurnBlock]) -> None:
        """Append turns (a running session's new ones; all of them when opened)."""
        if not blocks:
            return
        first = len(self.blocks)
        self.blocks.extend(blocks)
        if first == 0 or self._width != self.wrap_width:
            self._relayout()
        else:  # only the new turns' lines
            for i in range(first, len(self.blocks)):
                self._append_lines(i)
            self._resized()

    def turn_top(self, i: int) -> int:
        """The first line of the ``i``-th turn shown."""
        return self._starts[max(0, min(i, len(self._starts) - 1))] if self._starts else 0

    def toggle_prompts(self, open_: bool) -> None:
        self._open = set(range(len(self.blocks))) if open_ else set()
        self._relayout()

    def toggle_prompt(self, i: int) -> None:
        self._open ^= {i}
        self._relayout()

    # ---------------------------------------------------------------- layout

    def _append_lines(self, i: int) -> None:
        block, width = self.blocks[i], self._width
        self._starts.append(len(self._lines))
        lines = self._lines
        lines.extend((i, "body", segs) for segs in block.lines("body", width))
        prompt: Lines = block.lines("prompt-open" if i in self._open else "prompt", width)
        lines.extend((i, "prompt", segs) for segs in prompt)
        lines.append((i, "gap", []))

    def _relayout(self) -> None:
        self._width = self.wrap_width
        self._lines = []
        self._starts = []
        if not self.blocks and self.note:
            self._lines.append((-1, "note", [Segment(self.note)]))
        for i in range(len(self.blocks)):
            self._append_lines(i)
        self._resized()

    def _resized(self) -> None:
        self._strips.clear()
        self.virtual_size = Size(self._width + INDENT, len(self._lines))
        self.refresh()

    def on_resize(self, _event: events.Resize) -> None:
        if self.wrap_width != self._width:
            self._relayout()

    # ------------------------------------------------------------- rendering

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._styles = {}
        self.refresh()

    def _look_up_styles(self) -> dict[str, Style]:
        base = self.rich_style
        out = {"": base}
        for name in ("turn", "recovery", "failed", "prompt", "prompt-hover", "note"):
            out[name] = base + self.get_component_rich_style(f"transcript--{name}")
        return out

    def render_line(self, y: int) -> Strip:
        if not self._styles:
            self._styles = self._look_up_styles()
        styles = self._styles
        width = self.scrollable_content_region.width
        row = round(self.scroll_y) + y
        if row >= len(self._lines):
            return Strip.blank(width, styles[""])
        i, part, segs = self._lines[row]
        hover = part == "prompt" and i == self.hover_block
        strip = self._strips.get((row, hover))
        if strip is None:
            if len(self._strips) > 2048:
                self._strips.clear()
            base = styles[""]
            if part == "note":
                strip = Strip([Segment(" ", base), *Segment.apply_style(segs, styles["note"])])
            elif part == "gap":
                strip = Strip([])
            else:
                border = styles[self.blocks[i].kind or "turn"]
                text = styles["prompt-hover" if hover else "prompt"] if part == "prompt" else base
                strip = Strip([Segment(" ", base), Segment(BORDER, border), Segment(" ", base),
                               *Segment.apply_style(segs, text)])
            strip = self._strips[(row, hover)] = strip.crop_extend(0, width, base)
        return strip

    # ----------------------------------------------------------------- mouse

    def _prompt_at(self, event: events.MouseEvent) -> int | None:
        """The turn whose prompt line is under the mouse, if any."""
        offset = event.get_content_offset(self)
        if offset is None:
            return None
        row = round(self.scroll_y) + offset.y
        if 0 <= row < len(self._lines) and self._lines[row][1] == "prompt":
            return self._lines[row][0]
        return None

    def on_click(self, event: events.Click) -> None:
        i = self._prompt_at(event)
        if i is not None:
            self.toggle_prompt(i)

    def on_mouse_move(self, event: events.MouseMove) -> None:
        i = self._prompt_at(event)
        if i != self.hover_block:
            self.hover_block = i
            self.refresh()

    def on_leave(self, _event: events.Leave) -> None:
        if self.hover_block is not None:
            self.hover_block = None
            self.refresh()
