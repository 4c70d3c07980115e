"""``KeyBar``: the footer line with the keys of the focused widget and the screen.

Textual's ``Footer`` rebuilds one widget per key whenever the bindings change (a screen
pushed, focus moved), and styling those widgets was a good part of the time to show
the sessions table and to open a transcript. This one is a single line of text,
redrawn when the bindings change; a click on a key presses it, as on ``Footer``."""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.widget import Widget


class KeyBar(Widget):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"keybar--key", "keybar--description", "keybar--disabled"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom; height: 1; width: 1fr; text-wrap: nowrap; text-overflow: clip;
        color: $footer-foreground; background: $footer-background;
    }
    KeyBar > .keybar--key { color: $footer-key-foreground; background: $footer-key-background; text-style: bold; }
    KeyBar > .keybar--description { color: $footer-description-foreground;
                                    background: $footer-description-background; }
    KeyBar > .keybar--disabled { text-style: dim; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._keys: list[tuple[str, str, str, bool]] = []  # key, shown as, description, enabled
        self._palette: tuple[str, str, str, bool] | None = None  # the command palette's key
        self._spans: list[tuple[int, int, str]] = []  # cells of each key on the line

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self._bindings_changed(self.screen)

    def _bindings_changed(self, screen: Screen) -> None:
        if screen is not self.screen:
            return
        keys: list[tuple[str, str, str, bool]] = []
        seen: set[str] = set()
        palette = None
        for _node, binding, enabled, _tooltip in screen.active_bindings.values():
            if binding.key == self.app.COMMAND_PALETTE_BINDING and self.app.ENABLE_COMMAND_PALETTE:
                palette = (binding.key, self.app.get_key_display(binding), binding.description, enabled)
                continue
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            keys.append((binding.key, self.app.get_key_display(binding), binding.description, enabled))
        if (keys, palette) != (self._keys, self._palette):
            self._keys, self._palette = keys, palette
            self.refresh()

    def _append(self, text: Text, key: tuple[str, str, str, bool]) -> None:
        code, shown, description, enabled = key
        dim = Style() if enabled else self.get_component_rich_style("keybar--disabled")
        start = text.cell_len
        text.append(f" {shown} ", self.get_component_rich_style("keybar--key") + dim)
        if description:
            text.append(f"{description} ", self.get_component_rich_style("keybar--description") + dim)
        self._spans.append((start, text.cell_len, code))

    def render(self) -> Text:
        self._spans = []
        text = Text(no_wrap=True, overflow="crop")
        for key in self._keys:
            self._append(text, key)
        if self._palette is not None:  # at the right edge, over what does not fit
            palette = Text(no_wrap=True)
            spans, self._spans = self._spans, []
            self._append(palette, self._palette)
            palette = Text("▏") + palette
            left = max(0, self.size.width - palette.cell_len)
            text.truncate(left)
            text.pad_right(left - text.cell_len)
            (code_span,) = self._spans
            self._spans = [s for s in spans if s[1] <= left] + [(left + code_span[0] + 1, left + palette.cell_len,
                                                                 code_span[2])]
            text.append_text(palette)
        return text

    def on_click(self, event: events.Click) -> None:
        for start, end, key in self._spans:
            if start <= event.x < end:
                self.app.simulate_key(key)
                return
