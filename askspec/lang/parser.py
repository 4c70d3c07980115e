"""Text -> AST. Wraps the lark LALR parser, converts its tree to `ast` nodes with spans,
and turns every lexing/parsing failure into a Diagnostic (never an exception)."""

from __future__ import annotations

import errno
import functools
import math
import re
from importlib import resources

import lark
from lark import Token, Tree

from . import ast as A
from ..diagnostics import DiagnosticSink
from ..span import Span

MAX_BYTES = 1024 * 1024  # specs are small (prompts live in files); parsing is ~0.3 ms per line
MAX_NESTING = 64

KEYWORDS = {
    "experiment", "param", "model", "role", "template", "data", "buffer", "tournament",
    "judge", "train", "with", "schedule", "stage", "metric", "by", "game", "for", "in", "times",
    "sample", "ask", "using", "repeat", "while", "until", "limit", "if", "elif", "else",
    "reward", "as", "bind", "end", "outcomes", "route", "when", "true", "false", "not",
    "and", "or", "where", "case", "drop", "push", "profile",
}

DECLARATION_KEYWORDS = {"experiment", "param", "model", "role", "template", "data", "buffer", "tournament", "judge",
                        "train", "schedule", "stage", "metric", "game", "profile"}

# Friendlier names for lark's terminal names in "expected ..." messages.
_TERMINAL_NAMES = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "LONG_STRING": "a string",
    "LBRACE": "'{'", "RBRACE": "'}'", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['",
    "RSQB": "']'", "EQUAL": "'='", "COMMA": "','", "COLON": "':'", "SEMICOLON": "';'",
    "DOT": "'.'", "DOUBLE_DOT": "'..'", "MINUS": "'-'", "PLUS": "'+'", "CMP_OP": "a comparison",
    "MUL_OP": "'*', '/' or '%'", "VBAR": "'|'", "__ANON_0": "'->'", "RARROW": "'->'",
    "$END": "end of file",
}


@functools.lru_cache(maxsize=1)
def _lark() -> lark.Lark:
    """The parser, built once per process. Building the LALR tables takes ~0.2 s, so lark
    caches them on disk (keyed by the grammar's hash) and later processes load them in
    ~0.02 s; if the cache cannot be used the tables are simply rebuilt."""
    grammar = resources.files("askspec.lang").joinpath("grammar.lark").read_text()
    options = dict(parser="lalr", propagate_positions=True, maybe_placeholders=True)
    try:
        return lark.Lark(grammar, cache=True, **options)
    except Exception:  # an unwritable or stale cache file
        return lark.Lark(grammar, **options)


def _describe_expected(expected: set[str]) -> str:
    names = []
    for t in sorted(expected):
        name = _TERMINAL_NAMES.get(t)
        if name is None:
            try:
                pattern = _lark().get_terminal(t).pattern
                name = f"'{pattern.value}'" if pattern.type == "str" else t.lower()
            except KeyError:
                name = t.lower()
        names.append(name)
    names = sorted(set(names), key=lambda x: (not x.startswith("a "), x))  # "a name", "a number" first
    if len(names) > 6:
        return ", ".join(names[:6]) + ", ..."
    return ", ".join(names)


# Targeted hints for common syntax mistakes, found as lark's `match_examples` finds them:
# an error is the mistake of an example when the parser fails in the same LALR state
# (its number: nesting does not matter), expecting the same tokens, on a token of the
# same type; a check of the text before the token tells apart mistakes that share a
# state (`ask q: m using "t"` and `foo "bar"` both fail on a string after a name).
_ASK_ORDER = ("the clauses of an ask come in this order: [sample N] ask ROLES [using TEMPLATE] "
              "[: MESSAGE] [with RECORD] [with sampling { ... }]; move this one before the ones it follows")
# `with sampling { ... }` up to its closing brace, one level of role sections inside
_SAMPLING = r"\bwith\s+sampling\s*\{(?:[^{}]|\{[^{}]*\})*\}"
_MISTAKES: list[tuple[list[str], re.Pattern[str] | None, str]] = [
    (["metric m = x by a.b", "metric m = x by (a.b)", "metric m = x by (a, b.c)"], None,
     "`by` groups by session variables, not by fields: assign the field in the game "
     "(`{field} = {name}.{field}`) and group by that name (`by {field}`)"),
    (['game g { ask q: m using "t" }', 'game g { ask q with {a: 1} using "t" }'], re.compile(r"\busing\s*$"),
     _ASK_ORDER),
    (["game g { ask q with r: m }", "game g { ask q with {a: 1}: m }"], re.compile(r"\bask\b.*\bwith\b"), _ASK_ORDER),
    # anything after `with sampling { ... }`, which closes an ask (#24)
    (["game g { ask q with sampling { top_p = 1 } with {a: 1} }", "game g { ask q with sampling { top_p = 1 } using t }",
      'game g { ask q with sampling { top_p = 1 } using "t" }', "game g { ask q with sampling { top_p = 1 }: m }"],
     re.compile(_SAMPLING + r"\s*$"), _ASK_ORDER),
    (["game g { ask q with sampling { top_p = 1 } with {a: 1} }"], re.compile(_SAMPLING + r"\s*with\s*$"),
     _ASK_ORDER),
    (["game g { ask q with sampling { top_p = 1 } with sampling { top_k = 1 } }"],
     re.compile(_SAMPLING + r"\s*with\s*$"),
     "an ask takes one `with sampling { ... }`: set all its fields there (`with sampling { max_tokens = 10000; "
     "temperature = 0.6 }`)"),
    (["game g { ask q with sampling { q: { top_p = 1 } } }"], re.compile(r"\bwith\s+sampling\s*\{.*\b[A-Za-z_]\w*\s*$"),
     "a role's own sampling fields are a block after its name: `with sampling { {name} { max_tokens = 8192 } }`"),
    (['data d = jsonl("d.jsonl") { limit = 3 } where a == 1'], re.compile(r"^\s*data\b.*\}\s*$"),
     "a data set's `where` filter comes before its settings: data NAME = jsonl(\"...\") where COND { ... }"),
    (["game g { x = 1 if a else 0 }"], None,
     "`if` starts a statement (if COND { ... } else { ... }); for a value chosen by a condition "
     "write `case { COND -> A; else -> B }`"),
]


@functools.lru_cache(maxsize=1)
def _mistake_states() -> list[tuple[tuple[int, frozenset[str], str], re.Pattern[str] | None, str]]:
    out = []
    for examples, before, hint in _MISTAKES:
        for example in examples:
            try:
                _lark().parse(example)
            except lark.UnexpectedToken as e:
                out.append(((e.state.position, frozenset(e.accepts), e.token.type), before, hint))
    return out


def _mistake_hint(e: lark.UnexpectedToken, text: str) -> str | None:
    """The hint of the known mistake that ``e`` is, if any (see _MISTAKES)."""
    if e.state is None:
        return None
    key = (e.state.position, frozenset(e.accepts), e.token.type)
    before = text[: e.token.start_pos]
    before = before[before.rfind("\n") + 1 :]  # the line up to the token
    for state, pattern, hint in _mistake_states():
        if state == key and (pattern is None or pattern.search(before)):
            # the spec's own names in the hint's example (`by item.truth`: item, truth)
            name = re.search(r"([A-Za-z_]\w*)\s*$", before)
            field = re.match(r"\s*([A-Za-z_]\w*)", text[e.token.end_pos:] if e.token.end_pos is not None else "")
            return hint.replace("{name}", name.group(1) if name else "item").replace(
                "{field}", field.group(1) if field else "truth")
    return None


def _brackets(text: str):
    """Yield (char, line, col) of every bracket outside strings and comments."""
    line, col = 1, 1
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\n":
            line, col = line + 1, 1
            i += 1
            continue
        if ch == '"':
            if text.startswith('"""', i):
                j = text.find('"""', i + 3)
                j = n if j < 0 else j + 3
            else:
                j = i + 1
                while j < n and text[j] not in '"\n':
                    j += 2 if text[j] == "\\" else 1
                j += 1
            seg = text[i:j]
            nl = seg.count("\n")
            if nl:
                line += nl
                col = len(seg) - seg.rfind("\n")
            else:
                col += len(seg)
            i = j
            continue
        if ch == "#" or text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            col += j - i
            i = j
            continue
        if ch in "([{)]}":
            yield ch, line, col
        i += 1
        col += 1


def _nesting_problem(text: str) -> tuple[int, int] | None:
    """Where bracket nesting first exceeds MAX_NESTING."""
    depth = 0
    for ch, line, col in _brackets(text):
        if ch in "([{":
            depth += 1
            if depth > MAX_NESTING:
                return line, col
        else:
            depth -= 1
    return None


def _unclosed(text: str) -> tuple[str, int, int] | None:
    """The innermost bracket still open at the end of the text."""
    stack: list[tuple[str, int, int]] = []
    for ch, line, col in _brackets(text):
        if ch in "([{":
            stack.append((ch, line, col))
        elif stack:
            stack.pop()
    return stack[-1] if stack else None


def read_source(path: str) -> bytes:
    """The bytes of a spec file named on the command line: a regular file (a FIFO or a
    device such as /dev/zero is refused without reading or blocking), at most
    MAX_BYTES + 1 bytes of it (more is reported as too large). Raises OSError."""
    from .paths import FileRefused, open_regular

    try:
        with open_regular(path) as f:
            return f.read(MAX_BYTES + 1)
    except FileRefused as e:
        raise OSError(errno.EINVAL, str(e).removeprefix(f"{path} is ")) from None


def decode_source(path: str, data: bytes, sink: DiagnosticSink) -> str | None:
    if len(data) > MAX_BYTES:
        sink.error("E005", f"file is over {MAX_BYTES} bytes, the limit for a spec", Span(path, 1, 1, 1, 1),
                   hint="prompts belong in their own files: file(\"prompts/x.j2\")")
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line = before.count(b"\n") + 1
        col = len(before[before.rfind(b"\n") + 1 :].decode("utf-8", "replace")) + 1  # in characters
        sink.error("E004", f"invalid UTF-8 byte 0x{data[e.start]:02x}", Span(path, line, col, line, col + 1),
                   hint="save the file as UTF-8")
        return None
    if "\x00" in text:
        pos = text.index("\x00")
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        sink.error("E004", "binary data (NUL byte) in a spec file", Span(path, line, col, line, col + 1))
        return None
    return text.lstrip("\ufeff")


def parse(path: str, text: str, sink: DiagnosticSink) -> A.Module | None:
    """Parse one .ask file; on failure report a diagnostic and return None."""
    deep = _nesting_problem(text)
    if deep:
        sink.error("E005", f"brackets nested more than {MAX_NESTING} deep", Span(path, deep[0], deep[1], deep[0], deep[1] + 1))
        return None
    try:
        tree = _lark().parse(text)
    except lark.UnexpectedCharacters as e:
        pos = e.pos_in_stream if e.pos_in_stream is not None else -1
        ch = text[pos] if 0 <= pos < len(text) else "?"
        msg = f"unexpected character {ch!r}"
        hint = None
        if ch == '"':
            line, col = e.line, e.column
            if text[max(0, pos - 2):pos] == '""':  # lexed as "" then "...
                msg, hint, col = "unterminated long string", 'close it with \"\"\"', col - 2
            else:
                msg, hint = "unterminated string", "close the string with '\"' on the same line, or use \"\"\"...\"\"\" for several lines"
            sink.error("E002", msg, Span(path, line, col, line, col + 1), hint)
            return None
        sink.error("E003", msg, Span(path, e.line, e.column, e.line, e.column + 1), hint)
        return None
    except lark.UnexpectedToken as e:
        tok = e.token
        if tok.type == "$END":
            open_ = _unclosed(text)
            if open_ is not None:
                ch, line, col = open_
                closer = {"(": ")", "[": "]", "{": "}"}[ch]
                d = sink.error("E002", f"unexpected end of file: this '{ch}' is never closed",
                               Span(path, line, col, line, col + 1), hint=f"add the matching '{closer}'")
                end_line, end_col = _end_position(text)
                d.notes.append(("the file ends here", Span(path, end_line, end_col, end_line, end_col + 1)))
            else:
                line, col = _end_position(text)
                sink.error("E002", "unexpected end of file", Span(path, line, col, line, col + 1),
                           hint=f"expected {_describe_expected(e.expected)}")
        else:
            value = str(tok)
            open_ = _unclosed(text[: tok.start_pos]) if value in DECLARATION_KEYWORDS else None
            if open_ is not None and open_[0] == "{":
                # a declaration keyword inside a block: the block before it was left open
                _, line, col = open_
                d = sink.error("E002", "this '{' is not closed before the next declaration",
                               Span(path, line, col, line, col + 1), hint="add the matching '}'")
                d.notes.append((f"'{value}' starts a new declaration here", _tok_span(path, tok)))
                return None
            shown = value if len(value) <= 40 else value[:37] + "..."
            hint = _mistake_hint(e, text) or f"expected {_describe_expected(e.expected)}"
            if value in KEYWORDS and "NAME" in e.expected:
                hint += f"; '{value}' is a keyword and cannot be used as a name here"
            sink.error("E001", f"unexpected {shown!r}", _tok_span(path, tok), hint=hint)
        return None
    except lark.UnexpectedEOF:  # pragma: no cover - LALR reports UnexpectedToken($END)
        line, col = _end_position(text)
        sink.error("E002", "unexpected end of file", Span(path, line, col, line, col + 1))
        return None
    before = len(sink.items)
    module = _Builder(path, text, sink).module(tree)
    return None if any(d.is_error for d in sink.items[before:]) else module


def _end_position(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def _tok_span(path: str, tok: Token) -> Span:
    line = tok.line or 1
    col = tok.column or 1
    end_line = tok.end_line or line
    end_col = tok.end_column or col + max(1, len(str(tok)))
    return Span(path, line, col, end_line, end_col)


_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "r": "\r", "0": "\0"}


def _unescape(body: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), body)


MAX_NUMBER = 1.7976931348623157e308  # the largest finite float


def number_value(raw: str) -> int | float | None:
    """The value of a number literal; None when it is not a finite number (``1e400``, or
    an integer too long for a float). Integers stay ints."""
    if re.fullmatch(r"\d+", raw):
        if len(raw.lstrip("0")) > 309:  # cheaper than int(): and > 4300 digits int() refuses
            return None
        value: int | float = int(raw)
        return value if value <= MAX_NUMBER else None
    value = float(raw)
    return value if math.isfinite(value) else None


class _Builder:
    """Converts lark's parse tree into AST nodes; the few errors only found while building
    (a number literal out of range) go to ``sink``."""

    def __init__(self, path: str, text: str, sink: DiagnosticSink | None = None) -> None:
        self.path = path
        self.text = text
        self.sink = sink or DiagnosticSink()

    # -- spans
    def span(self, node: Tree | Token) -> Span:
        if isinstance(node, Token):
            return _tok_span(self.path, node)
        m = node.meta
        if getattr(m, "empty", True):
            return Span(self.path, 1, 1, 1, 1)
        return Span(self.path, m.line, m.column, m.end_line, m.end_column)

    def name(self, tok: Token | Tree) -> tuple[str, Span]:
        assert isinstance(tok, Token), tok  # the grammar's name positions hold NAME tokens
        return str(tok), self.span(tok)

    # -- module
    def module(self, tree: Tree) -> A.Module:
        decls = [self.decl(c) for c in tree.children]
        return A.Module(Span(self.path, 1, 1, 1, 1), self.path, decls)

    def decl(self, t: Tree):
        return self.DECLS[t.data](self, t)

    def d_experiment(self, t: Tree) -> A.Experiment:
        name, *items = t.children
        params = [self.d_param(c) for c in items if c.data == "param"]
        attrs = [self.attr(c) if c.data == "attr" else self.default_profile(c) for c in items
                 if c.data in ("attr", "default_profile")]
        return A.Experiment(self.span(t), str(name), params, attrs)

    def default_profile(self, t: Tree) -> A.Attribute:
        """`profile = NAME` in the experiment block: an attribute (the keyword is its name)."""
        (value,) = t.children
        m = t.meta
        name_span = Span(self.path, m.line, m.column, m.line, m.column + len("profile"))
        return A.Attribute(self.span(t), "profile", self.expr(value), name_span)

    def d_param(self, t: Tree) -> A.Param:
        name, typ, default = t.children
        return A.Param(self.span(t), str(name), self.span(name), self.type_expr(typ) if typ is not None else None, self.expr(default))

    def type_expr(self, t: Tree) -> A.TypeExpr:
        name, *args = t.children
        return A.TypeExpr(self.span(t), str(name), [self.type_expr(a) for a in args if a is not None])

    def body(self, t: Tree | None) -> list[A.Attribute]:
        if t is None:
            return []
        return [self.attr(c) for c in t.children]

    def attr(self, t: Tree) -> A.Attribute:
        name, value = t.children
        return A.Attribute(self.span(t), str(name), self.expr(value), self.span(name))

    def d_model(self, t: Tree) -> A.ModelDecl:
        name, base, body = t.children
        return A.ModelDecl(self.span(t), str(name), self.span(name), self.expr(base), self.body(body))

    def d_role(self, t: Tree) -> A.RoleDecl:
        names = [self.name(c) for c in t.children if isinstance(c, Token)]
        items = [c for c in t.children if isinstance(c, Tree)]
        attrs = [self.attr(c) for c in items if c.data == "attr"]
        flags = [A.Flag(self.span(c), str(c.children[0])) for c in items if c.data == "flag"]
        return A.RoleDecl(self.span(t), names, attrs, flags)

    def d_template(self, t: Tree) -> A.TemplateDecl:
        name, value = t.children
        return A.TemplateDecl(self.span(t), str(name), self.span(name), self.expr(value))

    def d_data(self, t: Tree) -> A.DataDecl:
        name, source, body = t.children
        return A.DataDecl(self.span(t), str(name), self.span(name), self.expr(source), self.body(body))

    def _block(self, kind: str, t: Tree) -> A.BlockDecl:
        name, body = t.children
        return A.BlockDecl(self.span(t), kind, str(name), self.span(name), self.body(body))

    def d_buffer(self, t):
        return self._block("buffer", t)

    def d_tournament(self, t):
        return self._block("tournament", t)

    def d_judge(self, t):
        return self._block("judge", t)

    def d_schedule(self, t):
        return self._block("schedule", t)

    def d_stage(self, t: Tree) -> A.StageDecl:
        name, kind, body = t.children
        return A.StageDecl(self.span(t), str(name), self.span(name), str(kind), self.span(kind), self.body(body))

    def d_train(self, t: Tree) -> A.TrainDecl:
        role, algo, body = t.children
        return A.TrainDecl(self.span(t), str(role), self.span(role), self.expr(algo), self.body(body))

    def d_metric(self, t: Tree) -> A.MetricDecl:
        name, value, by = t.children
        by_names = [self.name(c) for c in by.children] if by is not None else []
        return A.MetricDecl(self.span(t), str(name), self.span(name), self.expr(value), by_names)

    def d_profile(self, t: Tree) -> A.ProfileDecl:
        name, *items = t.children
        return A.ProfileDecl(self.span(t), str(name), self.span(name), [self.profile_item(c) for c in items])

    def profile_item(self, t: Tree):
        if t.data == "param":
            return self.d_param(t)
        if t.data == "schedule":
            return self.d_schedule(t)
        name, value, body = t.children
        value = self.expr(value) if value is not None else None
        if t.data == "profile_model":
            return A.ProfileModel(self.span(t), str(name), self.span(name), value, self.body(body))
        return A.ProfileTrain(self.span(t), str(name), self.span(name), value, self.body(body))

    def d_game(self, t: Tree) -> A.GameDecl:
        name, gfor, gtimes, gsample, block = t.children
        pattern: list[tuple[str, Span]] = []
        it = None
        if gfor is not None:
            pat, it_t = gfor.children
            pattern = [self.name(c) for c in pat.children]
            it = self.expr(it_t)
        times = self.expr(gtimes.children[0]) if gtimes is not None else None
        sample = self.expr(gsample.children[0]) if gsample is not None else None
        return A.GameDecl(self.span(t), str(name), self.span(name), pattern, it, times, sample, self.block(block))

    # -- statements
    def block(self, t: Tree) -> list:
        return [self.stmt(c) for c in t.children]

    def stmt(self, t: Tree):
        return self.STMTS[t.data](self, t)

    def s_assign_stmt(self, t: Tree) -> A.Assign:
        *targets, value = t.children
        v = self.ask(value) if isinstance(value, Tree) and value.data == "ask" else self.expr(value)
        return A.Assign(self.span(t), [self.name(x) for x in targets], v)

    def s_ask_stmt(self, t: Tree) -> A.AskStmt:
        return A.AskStmt(self.span(t), self.ask(t.children[0]))

    def ask(self, t: Tree) -> A.Ask:
        sample = using = message = with_ = sampling = None
        per_role: list[A.RoleSampling] = []
        roles = []
        for c in t.children:
            if c is None:
                continue
            if isinstance(c, Token):
                roles.append(self.name(c))
            elif c.data == "sample_clause":
                sample = self.expr(c.children[0])
            elif c.data == "using_clause":
                using = self.expr(c.children[0])
            elif c.data == "message_clause":
                message = self.expr(c.children[0])
            elif c.data == "with_clause":
                with_ = self.expr(c.children[0])
            elif c.data == "sampling_clause":
                items = c.children[0].children
                sampling = [self.attr(i) for i in items if i.data == "attr"]
                per_role = [A.RoleSampling(self.span(i), str(i.children[0]), self.span(i.children[0]),
                                           self.body(i.children[1])) for i in items if i.data == "sampling_role"]
        return A.Ask(self.span(t), roles, sample, using, message, with_, sampling, per_role)

    def s_repeat_stmt(self, t: Tree) -> A.Repeat:
        kids = t.children
        if len(kids) == 4:
            var, start, stop, block = kids
            return A.Repeat(self.span(t), self.name(var), self.expr(start), self.expr(stop), self.block(block))
        count, block = kids
        return A.Repeat(self.span(t), None, None, self.expr(count), self.block(block))

    def _limit(self, t: Tree | None):
        return self.expr(t.children[0]) if t is not None else None

    def s_while_stmt(self, t: Tree) -> A.While:
        cond, limit, block = t.children
        return A.While(self.span(t), self.expr(cond), self._limit(limit), False, self.block(block))

    def s_until_stmt(self, t: Tree) -> A.While:
        cond, limit, block = t.children
        return A.While(self.span(t), self.expr(cond), self._limit(limit), True, self.block(block))

    def s_for_stmt(self, t: Tree) -> A.For:
        pat, it, limit, block = t.children
        return A.For(self.span(t), [self.name(c) for c in pat.children], self.expr(it), self._limit(limit), self.block(block))

    def s_if_stmt(self, t: Tree) -> A.If:
        cond, block, *rest = t.children
        branches = [(self.expr(cond), self.block(block))]
        orelse = None
        for c in rest:
            if c is None:
                continue
            if c.data == "elif_clause":
                branches.append((self.expr(c.children[0]), self.block(c.children[1])))
            else:
                orelse = self.block(c.children[0])
        return A.If(self.span(t), branches, orelse)

    def s_reward_stmt(self, t: Tree) -> A.Reward:
        target, name, value = t.children
        return A.Reward(self.span(t), str(target), self.span(target), str(name) if name is not None else None, self.expr(value))

    def s_bind_stmt(self, t: Tree) -> A.Bind:
        role, value = t.children
        return A.Bind(self.span(t), str(role), self.span(role), self.expr(value))

    def s_end_stmt(self, t: Tree) -> A.End:
        (outcome,) = t.children
        return A.End(self.span(t), self.name(outcome) if outcome is not None else None)

    def s_outcomes_stmt(self, t: Tree) -> A.Outcomes:
        return A.Outcomes(self.span(t), [self.name(c) for c in t.children])

    def s_drop_stmt(self, t: Tree) -> A.Drop:
        (target,) = t.children
        return A.Drop(self.span(t), str(target), self.span(target))

    def s_push_stmt(self, t: Tree) -> A.Push:
        buffer, value = t.children
        return A.Push(self.span(t), str(buffer), self.span(buffer), self.expr(value))

    def s_route_stmt(self, t: Tree) -> A.Route:
        role, *arms = t.children
        out = []
        for arm in arms:
            if arm.data == "route_when":
                cond, target = arm.children
                cond_e = self.expr(cond)
            else:
                (target,) = arm.children
                cond_e = None
            kind, arg = target.children
            out.append(A.RouteArm(self.span(arm), cond_e, str(kind), self.span(kind), self.name(arg) if arg is not None else None))
        return A.Route(self.span(t), str(role), self.span(role), out)

    # -- expressions
    def expr(self, t) -> A.Expr:
        if isinstance(t, Token):  # bare tokens only appear for NAME in a few places
            return A.Name(self.span(t), str(t))
        return self.EXPRS[t.data](self, t)

    def e_number(self, t: Tree) -> A.Number:
        raw = str(t.children[0])
        value = number_value(raw)
        if value is None:
            shown = raw if len(raw) <= 24 else raw[:21] + "..."
            self.sink.error("E006", f"number {shown} is out of range (larger than about 1.8e308, not a finite number)",
                            self.span(t), hint="numbers are 64-bit floats (and integers within their range)")
            value = 0  # a stand-in; parse() reports the module as failed
        return A.Number(self.span(t), value)

    def e_string(self, t: Tree) -> A.String:
        tok = t.children[0]
        raw = str(tok)
        sp = self.span(t)
        if raw.startswith('"""'):
            body = raw[3:-3]
            line, col = sp.line, sp.col + 3
            if body.startswith("\n"):
                body = body[1:]
                line, col = line + 1, 1
            import textwrap

            return A.String(sp, textwrap.dedent(body), line, col, long=True)
        return A.String(sp, _unescape(raw[1:-1]), sp.line, sp.col + 1)

    def e_true(self, t):
        return A.Bool(self.span(t), True)

    def e_false(self, t):
        return A.Bool(self.span(t), False)

    def e_name(self, t):
        return A.Name(self.span(t), str(t.children[0]))

    def e_list_lit(self, t):
        return A.ListLit(self.span(t), [self.expr(c) for c in t.children if c is not None])

    def e_record_lit(self, t):
        fields = []
        for f in t.children:
            if f is None:
                continue
            key, value = f.children
            k = str(key)
            if key.type in ("STRING",):
                k = _unescape(k[1:-1])
            fields.append((k, self.expr(value)))
        return A.RecordLit(self.span(t), fields)

    def _args(self, t: Tree | None) -> tuple[list[A.Expr], list[tuple[str, A.Expr]]]:
        args: list[A.Expr] = []
        kwargs: list[tuple[str, A.Expr]] = []
        if t is None:
            return args, kwargs
        for a in t.children:
            if isinstance(a, Tree) and a.data == "kwarg":
                kwargs.append((str(a.children[0]), self.expr(a.children[1])))
            else:
                args.append(self.expr(a))
        return args, kwargs

    def e_call(self, t: Tree):
        func, argt = t.children
        f = self.expr(func)
        args, kwargs = self._args(argt)
        if not isinstance(f, A.Name):
            # Method-style calls are not part of the language; keep a Call with a dotted name
            # so the checker reports an unknown function at the right place.
            return A.Call(self.span(t), _dotted(f), f.span, args, kwargs)
        return A.Call(self.span(t), f.id, f.span, args, kwargs)

    def e_attr_access(self, t: Tree):
        obj, name = t.children
        return A.Attr(self.span(t), self.expr(obj), str(name))

    def e_index(self, t: Tree):
        obj, idx = t.children
        return A.Index(self.span(t), self.expr(obj), self.expr(idx))

    def e_pipe(self, t: Tree):
        lhs, call_like = t.children
        fname, argt = call_like.children
        args, kwargs = self._args(argt)
        return A.Call(self.span(t), str(fname), self.span(fname), [self.expr(lhs), *args], kwargs)

    def e_where(self, t: Tree):
        seq, cond = t.children
        return A.Where(self.span(t), self.expr(seq), self.expr(cond))

    def e_or_op(self, t):
        return A.Binary(self.span(t), "or", self.expr(t.children[0]), self.expr(t.children[1]))

    def e_and_op(self, t):
        return A.Binary(self.span(t), "and", self.expr(t.children[0]), self.expr(t.children[1]))

    def e_not_op(self, t):
        return A.Unary(self.span(t), "not", self.expr(t.children[0]))

    def e_compare(self, t):
        l, op, r = t.children
        return A.Binary(self.span(t), str(op), self.expr(l), self.expr(r))

    def e_binary(self, t):
        l, op, r = t.children
        return A.Binary(self.span(t), str(op), self.expr(l), self.expr(r))

    def e_neg(self, t):
        _, operand = t.children
        inner = self.expr(operand)
        if isinstance(inner, A.Number):  # fold literal negatives so `-0.2` is a constant
            return A.Number(self.span(t), -inner.value)
        return A.Unary(self.span(t), "-", inner)

    def e_case_e(self, t: Tree):
        subject = None
        arms = []
        default = None
        for c in t.children:
            if c is None:
                continue
            if isinstance(c, Tree) and c.data == "case_arm":
                arms.append((self.expr(c.children[0]), self.expr(c.children[1])))
            elif isinstance(c, Tree) and c.data == "case_else":
                default = self.expr(c.children[0])
            else:
                subject = self.expr(c)
        return A.Case(self.span(t), subject, arms, default)

    # the handler of each kind (one table: a missing handler is a KeyError here, not an attribute lookup)
    DECLS = {
        "experiment": d_experiment,
        "param": d_param,
        "model": d_model,
        "role": d_role,
        "template": d_template,
        "data": d_data,
        "buffer": d_buffer,
        "tournament": d_tournament,
        "judge": d_judge,
        "schedule": d_schedule,
        "stage": d_stage,
        "train": d_train,
        "metric": d_metric,
        "profile": d_profile,
        "game": d_game,
    }

    # the handler of each kind (one table: a missing handler is a KeyError here, not an attribute lookup)
    STMTS = {
        "assign_stmt": s_assign_stmt,
        "ask_stmt": s_ask_stmt,
        "repeat_stmt": s_repeat_stmt,
        "while_stmt": s_while_stmt,
        "until_stmt": s_until_stmt,
        "for_stmt": s_for_stmt,
        "if_stmt": s_if_stmt,
        "reward_stmt": s_reward_stmt,
        "bind_stmt": s_bind_stmt,
        "end_stmt": s_end_stmt,
        "outcomes_stmt": s_outcomes_stmt,
        "drop_stmt": s_drop_stmt,
        "push_stmt": s_push_stmt,
        "route_stmt": s_route_stmt,
    }

    # the handler of each kind (one table: a missing handler is a KeyError here, not an attribute lookup)
    EXPRS = {
        "number": e_number,
        "string": e_string,
        "true": e_true,
        "false": e_false,
        "name": e_name,
        "list_lit": e_list_lit,
        "record_lit": e_record_lit,
        "call": e_call,
        "attr_access": e_attr_access,
        "index": e_index,
        "pipe": e_pipe,
        "where": e_where,
        "or_op": e_or_op,
        "and_op": e_and_op,
        "not_op": e_not_op,
        "compare": e_compare,
        "binary": e_binary,
        "neg": e_neg,
        "case_e": e_case_e,
    }


def _dotted(e: A.Expr) -> str:
    if isinstance(e, A.Name):
        return e.id
    if isinstance(e, A.Attr):
        return _dotted(e.obj) + "." + e.name
    return "<expr>"
