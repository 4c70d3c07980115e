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


def os_error(e: OSError, action: str = "cannot use") -> str:
    """An OSError as one sentence naming the path, not ``[Errno 2] ...``:
    ``cannot read runs/x/manifest.json: no such file or directory``."""
    reason = (e.strerror or str(e) or type(e).__name__).rstrip(".")
    reason = reason[:1].lower() + reason[1:]
    path = e.filename if e.filename is not None else None
    if path is None:
        return f"{action}: {reason}"
    target = f" (to {e.filename2})" if e.filename2 is not None else ""
    return printable(f"{action} {path}{target}: {reason}", single_line=True)
