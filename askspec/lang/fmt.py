"""The formatter: canonical spacing and indentation, comments and line structure kept.

It works on the token stream (lark's lexer with comments captured) rather than the AST,
so comments survive and the output parses to the same AST: the IR hash never changes.
Rules:

- one indent level (4 spaces) per line that leaves brackets open, whatever the number of
  brackets it opens (`json({` indents its contents once);
- one more for a line that goes on with an ask's `using` or `with` clause (neither starts
  a statement, so such a line continues the one above);
- one space between tokens, except around `.`, `..`, before `,` `;` `:` `)` `]`, after
  `(` `[`, between a name and its call or index bracket, after a prefix minus, and inside
  the braces of a record literal (`{final: true}`; blocks keep `{ a = 1 }`);
- at most one blank line where the author had some; none at the start or end;
- trailing comments of consecutive lines are aligned two spaces after the longest code.

Long strings (`\"\"\"...\"\"\"`) are copied verbatim. Callers format only specs that parse.
"""

from __future__ import annotations

import functools

import lark
from lark import Token

from .parser import _lark

OPEN = {"(", "[", "{"}
CLOSE = {")", "]", "}"}
NO_SPACE_BEFORE = {")", "]", ",", ".", ";", ":", ".."}
NO_SPACE_AFTER = {"(", "[", ".", ".."}
# after these a '-' is a prefix minus (no space between it and its operand)
PREFIX_CONTEXT = {"(", "[", "{", ",", ":", "=", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "->", "|",
                  "not", "and", "or", "in", "if", "elif", "while", "until", "case", "when", "where", "with",
                  "using", "sample", "times", "limit", "repeat", "ask", "reward", "bind", "else"}
# after these a '{' opens a record literal, not a block
RECORD_CONTEXT = {"=", "==", "!=", "with", ":", "(", "[", ",", "->", "{", "|", "in"}
# keywords that keep a space before '(' (`if (a or b)`); `reward(role)` and `end(too_long)`
# (a role's prompt_overflow) are calls
KEYWORDS_BEFORE_PAREN = {"if", "elif", "while", "until", "for", "in", "case", "and", "or", "not", "where", "when",
                         "with", "using", "sample", "times", "by", "limit", "repeat", "ask", "bind"}
# a line starting with one of these continues the statement above (an ask's clauses)
CONTINUATION = {"with", "using"}
INDENT = "    "
COMMENT_GAP = 2


@functools.lru_cache(maxsize=1)
def _comment_lexer() -> tuple[lark.Lark, list[Token]]:
    sink: list[Token] = []
    return lark.Lark(_lark().source_grammar, parser="lalr", lexer_callbacks={"COMMENT": sink.append}), sink


def _tokens(text: str) -> list[Token]:
    lx, sink = _comment_lexer()
    sink.clear()
    toks = list(lx.lex(text))
    comments = list(sink)
    sink.clear()
    return sorted(toks + comments, key=lambda t: (t.line, t.column))


def _source_lines(tokens: list[Token]) -> list[tuple[int, list[Token]]]:
    """Tokens grouped by the source line they start on, with the number of blank source
    lines before each group."""
    groups: list[tuple[int, list[Token]]] = []
    last_end: int | None = None
    for t in tokens:
        assert t.line is not None  # lark's lexer positions every token
        if last_end is None or t.line > last_end:
            gap = 0 if last_end is None else t.line - last_end - 1
            groups.append((gap, [t]))
        else:
            groups[-1][1].append(t)
        last_end = max(last_end or 0, t.end_line or t.line)
    return groups


class _Line:
    def __init__(self, indent: int, code: str, comment: str | None, blank_before: bool) -> None:
        self.indent, self.code, self.comment, self.blank_before = indent, code, comment, blank_before


def format_source(text: str) -> str:
    stack: list[tuple[int, bool]] = []  # per open bracket: (indent of its contents, is a record)
    out: list[_Line] = []
    for gap, toks in _source_lines(_tokens(text)):
        comment = str(toks[-1]) if toks[-1].type == "COMMENT" else None
        code_toks = toks[:-1] if comment is not None else toks
        first = str(code_toks[0]) if code_toks else ""
        base = stack[-1][0] if stack else 0
        indent = max(0, base - 1) if first in CLOSE else base + (first in CONTINUATION)
        parts: list[str] = []
        prev: Token | None = None
        prefix_minus = False
        for t in code_toks:
            v = str(t)
            if prev is not None:
                parts.append(" " if _space(prev, t, prefix_minus, stack) else "")
            parts.append(v)
            prefix_minus = v == "-" and (prev is None or str(prev) in PREFIX_CONTEXT)
            if v in OPEN:
                record = v == "{" and prev is not None and str(prev) in RECORD_CONTEXT
                # all brackets opened on one line indent their contents by one level
                stack.append((indent + 1, record))
            elif v in CLOSE and stack:
                stack.pop()
            prev = t
        if comment is not None and not code_toks:
            out.append(_Line(indent, comment, None, gap > 0))
        else:
            out.append(_Line(indent, "".join(parts), comment, gap > 0))
    return _render(out)


def _space(prev: Token, t: Token, prefix_minus: bool, stack: list[tuple[int, bool]]) -> bool:
    p, v = str(prev), str(t)
    if v in NO_SPACE_BEFORE or p in NO_SPACE_AFTER or prefix_minus:
        return False
    if v in ("(", "[") and ((prev.type == "NAME" or p in ("reward", "end")) and p not in KEYWORDS_BEFORE_PAREN
                            or p in (")", "]")):
        return False  # a call or an index
    if p == "{" and stack and stack[-1][1]:
        return False  # just inside a record literal's '{'
    if v == "}" and stack and stack[-1][1]:
        return False  # just before a record literal's '}'
    if p == "{" and v == "}":
        return False
    return True


def _last_width(ln: _Line) -> int:
    """Width of the line's last physical line (a long string may span several)."""
    code = INDENT * ln.indent + ln.code
    return len(code) - code.rfind("\n") - 1


def _render(lines: list[_Line]) -> str:
    # align the trailing comments of each run of consecutive commented lines
    widths: dict[int, int] = {}
    run: list[int] = []

    def close_run() -> None:
        if run:
            w = max(_last_width(lines[i]) for i in run)
            for i in run:
                widths[i] = w
            run.clear()

    for i, ln in enumerate(lines):
        if ln.comment is not None and not ln.blank_before:
            run.append(i)
        elif ln.comment is not None:
            close_run()
            run.append(i)
        else:
            close_run()
    close_run()
    text: list[str] = []
    for i, ln in enumerate(lines):
        if ln.blank_before and text:
            text.append("")
        code = INDENT * ln.indent + ln.code
        if ln.comment is not None:
            code += " " * (widths[i] + COMMENT_GAP - _last_width(ln)) + ln.comment
        text.append(code.rstrip())
    return "\n".join(text) + "\n" if text else ""
