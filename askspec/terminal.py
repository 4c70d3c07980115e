"""Text bound for a person's terminal: control characters made visible.

Model output is data. Printed raw, an ESC sequence in a reply can move the cursor,
recolour the terminal, rewrite the window title or hide what came before it, so every
human-facing output (query tables, progress lines, diagnostics, the TUI) passes text
through ``printable`` first. Machine-facing outputs (CSV, JSON, the event files) keep
the text exactly as it was.
"""

from __future__ import annotations

import re

# C0 controls except tab/newline, DEL, C1 controls, and the Unicode bidi overrides that
# can reorder what a reader sees.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

_NAMED = {"\x1b": "\\e", "\r": "\\r", "\n": "\\n", "\t": "\\t", "\x00": "\\0"}


def _visible(m: re.Match[str]) -> str:
    ch = m.group(0)
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def printable(text: str, *, single_line: bool = False) -> str:
    """``text`` with every control character shown as an escape (``\\e``, ``\\x07``, ...).

    ``single_line=True`` also escapes newlines and tabs (table cells, progress lines);
    otherwise they are kept (multi-line transcripts)."""
    pattern = _CONTROL_OR_NEWLINE if single_line else _CONTROL
    return pattern.sub(_visible, text)
