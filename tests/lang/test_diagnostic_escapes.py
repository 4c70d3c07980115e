"""Diagnostics never pass control characters to the terminal: source lines, messages,
notes and hints are escaped with `askspec.terminal.printable`, and the caret still
points at the span in the escaped line."""

from __future__ import annotations

from askspec.lang.compiler import compile_source
from askspec.diagnostics import format_diagnostic

CONTROLS = "\x1b\x07\x9b\u202e\r"


def rendered(src: str, overrides=None) -> list[str]:
    res = compile_source("t.ask", src, overrides)
    return [format_diagnostic(d, res.sources) for d in res.sink.sorted()]


def test_source_line_is_escaped_and_the_caret_still_points_at_the_span():
    src = 'param a = 1  # \x1b]0;pwned\x07 title \u202e\nparam b = "\x1b[2J" + scroe\n'
    texts = rendered(src)
    text = next(t for t in texts if "E107" in t)
    assert not any(c in "\n".join(texts) for c in CONTROLS)
    header, line, caret = text.splitlines()[:3]
    assert line == ' 2 | param b = "\\e[2J" + scroe'
    start = caret.index("^")
    assert line[start:start + caret.count("^")] == "scroe"


def test_messages_hints_and_notes_are_escaped():
    texts = [t for t in rendered("param n: int = 3\n", {"n": '"\x1b[31mred\x07"'}) if "E114" not in t]  # no game
    assert texts and "E111" in texts[0]
    assert not any(c in texts[0] for c in CONTROLS)
    assert "\\e[31mred\\x07" in texts[0]
    texts = rendered('role q\x1b { }\n')
    assert not any(c in "\n".join(texts) for c in CONTROLS)


def test_tabs_keep_the_caret_aligned():
    text = next(t for t in rendered("param a =\t\tscroe\n") if "E107" in t)
    _, line, caret = text.splitlines()[:3]
    start = caret.index("^")
    assert line[start:start + caret.count("^")] == "scroe"
