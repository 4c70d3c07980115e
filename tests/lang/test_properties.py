"""Property tests: the compiler never crashes on mutated specs, and the formatter is
idempotent and never changes what a spec means."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from askspec.ir.canonical import experiment_hash
from askspec.lang.compiler import compile_bytes, compile_source
from askspec.lang.fmt import _tokens, format_source

from lang_helpers import EXAMPLES, SPECS

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.ask"))
SOURCES = [(p, p.read_bytes()) for p in EXAMPLES + GOLDEN]
VOCAB = [b"{", b"}", b"(", b")", b"[", b"]", b",", b";", b":", b"=", b"->", b"..", b".", b"|", b"-", b"*",
         b"ask", b"game", b"role", b"reward", b"route", b"case", b"where", b"end", b"drop", b"push", b"sample",
         b"repeat", b"while", b"limit", b"for", b"in", b"if", b"else", b"outcomes", b"bind", b"model", b"param",
         b"x", b"questioner", b"policy", b"1", b"0.5", b"-3", b'"s"', b'"""t\n"""', b'"{{ nope }}"', b'file("a.j2")',
         b"#c\n", b"\n", b" ", b"\t", b"\xff", b"\x00", b"\xe2\x82", "é".encode()]
SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_no_crash(path: Path, data: bytes) -> None:
    res = compile_bytes(str(path), data)  # never raises: problems are diagnostics
    codes = [d.code for d in res.sink.items]
    assert "E999" not in codes, [d.message for d in res.sink.items if d.code == "E999"]
    if res.sink.has_errors:
        assert res.ir is None


@st.composite
def mutated(draw) -> tuple[Path, bytes]:
    path, data = draw(st.sampled_from(SOURCES))
    for _ in range(draw(st.integers(1, 4))):
        n = len(data)
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 40)))
        op = draw(st.sampled_from(["delete", "insert", "duplicate", "truncate", "bytes", "swap"]))
        if op == "delete":
            data = data[:i] + data[j:]
        elif op == "insert":
            data = data[:i] + b" " + draw(st.sampled_from(VOCAB)) + b" " + data[i:]
        elif op == "duplicate":
            data = data[:j] + data[i:j] + data[j:]
        elif op == "truncate":
            data = data[:i]
        elif op == "bytes":
            data = data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
        else:
            k = draw(st.integers(0, n))
            data = data[:i] + data[k:k + 20] + data[i + 20:]
    return path, data


def _lexes(path: Path) -> bool:
    try:
        _tokens(path.read_text())
        return True
    except Exception:  # not UTF-8, or a lexical error (these fixtures test exactly that)
        return False


TEXT_SOURCES = [(p, p.read_text()) for p in EXAMPLES + GOLDEN if _lexes(p)]


@st.composite
def token_mutated(draw) -> tuple[Path, bytes]:
    """Delete, duplicate, move or insert whole tokens: mostly still lexes, often parses,
    so the checker (not just the parser) sees odd programs."""
    path, text = draw(st.sampled_from(TEXT_SOURCES))
    toks = [str(t) for t in _tokens(text)] if text else []
    for _ in range(draw(st.integers(1, 5))):
        i = draw(st.integers(0, max(0, len(toks) - 1)))
        op = draw(st.sampled_from(["delete", "duplicate", "move", "insert"]))
        if op == "delete" and toks:
            del toks[i]
        elif op == "duplicate" and toks:
            toks.insert(i, toks[i])
        elif op == "move" and toks:
            toks.insert(draw(st.integers(0, len(toks) - 1)), toks.pop(i))
        else:
            toks.insert(i, draw(st.sampled_from(VOCAB)).decode("utf-8", "replace"))
    return path, "\n".join(toks).encode("utf-8", "surrogatepass")


LITERALS = ["0", "1", "-1", "2.5", "1000001", '"x"', '""', "true", "false", "[]", "[1, 2]", "{}", '{a: 1}',
            'file("nope.j2")', '"{{ zz }}"', "none"]


@st.composite
def name_mutated(draw) -> tuple[Path, bytes]:
    """Swap names and literals for others (from the same file or odd ones): keeps the
    spec parsing, so these exercise the checker's name and type handling."""
    path, text = draw(st.sampled_from(TEXT_SOURCES))
    toks = _tokens(text)
    names = sorted({str(t) for t in toks if t.type == "NAME"}) or ["x"]
    pieces, last = [], 0
    for t in toks:
        if t.type in ("NAME", "NUMBER", "STRING") and draw(st.integers(0, 9)) == 0:
            new = draw(st.sampled_from(names + ["undefined_x", "outcome", "it", "rewards"])) if t.type == "NAME" \
                else draw(st.sampled_from(LITERALS))
            pieces += [text[last:t.start_pos], new]
            last = t.end_pos
    pieces.append(text[last:])
    return path, "".join(pieces).encode()


@SETTINGS
@given(name_mutated())
def test_name_mutations_never_crash(case: tuple[Path, bytes]) -> None:
    check_no_crash(*case)


@SETTINGS
@given(mutated())
def test_byte_mutations_never_crash(case: tuple[Path, bytes]) -> None:
    check_no_crash(*case)


@SETTINGS
@given(token_mutated())
def test_token_mutations_never_crash(case: tuple[Path, bytes]) -> None:
    check_no_crash(*case)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(1, 400), st.sampled_from(["(", "[", "{"]), st.sampled_from(SOURCES))
def test_deep_nesting_never_crashes(depth: int, bracket: str, source: tuple[Path, bytes]) -> None:
    close = {"(": ")", "[": "]", "{": "}"}[bracket]
    path, data = source
    for body in (f"param deep = {bracket * depth}1{close * depth}\n",
                 "game g {\n" + "if true {\n" * depth + "}\n" * (depth + 1),
                 "metric m = " + "not " * depth + "true\n",
                 "metric m = " + "-" * depth + "1\n",
                 "metric m = 1" + " + 1" * depth * 10 + "\n"):
        check_no_crash(path, data + b"\n" + body.encode())


def test_huge_and_odd_files_never_crash() -> None:
    path = SPECS[0]
    data = path.read_bytes()
    check_no_crash(path, data * 40)  # duplicate declarations, ~150 KB
    check_no_crash(path, b"#" + b"x" * (2 * 1024 * 1024))  # over the size limit
    check_no_crash(path, b"\xef\xbb\xbf" + data)  # BOM
    check_no_crash(path, data.replace(b"\n", b"\r\n"))
    check_no_crash(path, data.replace(b"\n", b"\r"))
    check_no_crash(path, data[: len(data) // 2] + b"\xc3")  # cut in a UTF-8 sequence


# ---- formatter -----------------------------------------------------------------------
SEPARATORS = [" ", "  ", "\n", "\n\n\n", "\t", " # a comment\n", "\n    ", " ;"[0]]


def respaced(text: str, draw) -> str:
    """The same tokens, with random whitespace and comments between them."""
    toks = [t for t in _tokens(text) if t.type != "COMMENT"]
    out = [str(toks[0])]
    for t in toks[1:]:
        out.append(draw(st.sampled_from(SEPARATORS)))
        out.append(str(t))
    return "".join(out) + "\n"


def test_fmt_idempotent_and_meaning_preserving_on_specs(spec: Path) -> None:
    text = spec.read_text()
    once = format_source(text)
    assert format_source(once) == once
    assert once == text, f"{spec.name} is not formatted (run askspec fmt)"
    before = compile_source(str(spec), text)
    after = compile_source(str(spec), once)
    assert before.ok and after.ok
    assert experiment_hash(before.ir) == experiment_hash(after.ir)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(EXAMPLES), st.data())
def test_fmt_idempotent_on_respaced_specs(spec: Path, data) -> None:
    variant = respaced(spec.read_text(), data.draw)
    res = compile_source(str(spec), variant)
    assert res.ok, [d.message for d in res.sink.items]
    once = format_source(variant)
    assert format_source(once) == once
    again = compile_source(str(spec), once)
    assert again.ok
    assert experiment_hash(again.ir) == experiment_hash(res.ir)
    assert experiment_hash(res.ir) == experiment_hash(compile_source(str(spec), spec.read_text()).ir)


def test_fmt_keeps_every_comment(spec: Path) -> None:
    text = spec.read_text()
    comments = [str(t) for t in _tokens(text) if t.type == "COMMENT"]
    out = format_source(text)
    assert [str(t) for t in _tokens(out) if t.type == "COMMENT"] == comments
    assert comments, "specs are expected to carry comments"
