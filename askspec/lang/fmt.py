"""The formatter: canonical spacing and indentation, comments and line structure kept.

It works on the token stream (lark's lexer with comments captured) rather than the AST,
so comments survive and the output parses to the same AST: the IR hash never changes.
Callers format only specs that parse."""

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
KEYWORDS_BEFORE_PAREN = {"if", "elif", "while", "until", "for", "in", "case", "and", "or", "not", "where", "when",
                         "with", "using", "sample", "times", "by", "limit", "repeat", "ask", "reward", "bind"}
INDENT = "    "


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


def format_source(text: str) -> str:
    lines: list[str] = []
    cur: list[str] = []
    depth = 0
    line_depth = 0
    prev: Token | None = None
    prev_is_prefix_minus = False

    def flush() -> None:
        if cur:
            lines.append(INDENT * line_depth + "".join(cur).rstrip())
        cur.clear()

    for t in _tokens(text):
        v = str(t)
        if prev is not None and t.line > (prev.end_line or prev.line):
            flush()
            if t.line - (prev.end_line or prev.line) > 1 and lines and lines[-1] != "":
                lines.append("")  # keep one blank line where the author had some
        if not cur:
            line_depth = max(0, depth - (1 if v in CLOSE else 0))
            cur.append(v)
        elif t.type == "COMMENT":
            cur.append("  " + v)
        else:
            p = str(prev)
            space = not (v in NO_SPACE_BEFORE or p in NO_SPACE_AFTER or prev_is_prefix_minus)
            if v in ("(", "[") and (prev.type == "NAME" and p not in KEYWORDS_BEFORE_PAREN or p in (")", "]")):
                space = False  # a call or an index
            cur.append((" " if space else "") + v)
        if t.type != "COMMENT":
            prev_is_prefix_minus = v == "-" and (prev is None or str(prev) in PREFIX_CONTEXT)
            if v in OPEN:
                depth += 1
            elif v in CLOSE:
                depth = max(0, depth - 1)
            prev = t
        else:
            prev = t if prev is None else Token.new_borrow_pos(prev.type, str(prev), t) if False else _with_end(prev, t)
    flush()
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


def _with_end(prev: Token, comment: Token) -> Token:
    """Keep the previous code token's text/type but the comment's line (for line breaks)."""
    tok = Token(prev.type, str(prev))
    tok.line = comment.line
    tok.end_line = comment.end_line or comment.line
    tok.column = comment.column
    return tok
