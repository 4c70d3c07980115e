"""Prompt templates: loading (inline or file), Jinja2 syntax checks, and the variables a
template needs, located at the template's own line so an undefined one is reported there.

Templates are parsed in the sandbox of `sandbox.py`, the same environment the runtime
renders them in; what that sandbox is certain to refuse is reported here (E305)."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

import jinja2
from jinja2 import meta

from ..ir import model as ir
from . import ast as A
from ..diagnostics import DiagnosticSink
from .paths import MAX_TEMPLATE_BYTES, FileRefused, read_spec_file, spec_relative
from .sandbox import environment
from ..span import Span
from .template_checks import field_uses, guarded_names, static_problems


CONFINED_HINT = "a spec reads only regular files inside its own folder (symlinks are followed first)"



@dataclass
class LoadedTemplate:
    key: str  # key in Experiment.templates
    source: str
    path: str | None  # path relative to the spec's folder (file templates)
    display_path: str  # path used in diagnostics
    origin_line: int  # line/col in display_path where the source starts
    origin_col: int
    variables: list[str]
    span: Span  # where it is referenced in the spec
    # (variable, fields read in order, template line) of each field access, checked per ask (E202)
    fields: list[tuple[str, tuple[str, ...], int]] = field(default_factory=list)
    # variables it tests with `is defined` or reads through `| default(...)` (E409 leaves them out)
    guarded: set[str] = field(default_factory=set)


def load_template(e: A.Expr, spec_dir: str, spec_path: str, sink: DiagnosticSink, files: dict[str, str],
                  name: str | None = None) -> LoadedTemplate | None:
    """Resolve a template expression: a string literal (inline) or file("path")."""
    if isinstance(e, A.String):
        digest = hashlib.sha256(e.value.encode()).hexdigest()[:10]
        key = name or f"inline:{digest}"
        return _analyse(key, e.value, None, spec_path, e.content_line, e.content_col, e.span, sink)
    if isinstance(e, A.Call) and e.func == "file" and len(e.args) == 1 and isinstance(e.args[0], A.String):
        rel = e.args[0].value
        full = os.path.normpath(os.path.join(spec_dir, rel))
        try:
            text = read_spec_file(spec_dir, rel, MAX_TEMPLATE_BYTES).decode("utf-8")
        except FileRefused as err:
            sink.error("E304", f"template file refused: {err}", e.args[0].span, CONFINED_HINT)
            return None
        except FileNotFoundError:
            sink.error("E303", f"template file not found: {rel}", e.args[0].span,
                       f"looked for {_display_path(spec_path, rel)} (paths are relative to the spec's folder)")
            return None
        except (OSError, UnicodeDecodeError) as err:
            sink.error("E303", f"cannot read template file {rel}: {getattr(err, 'strerror', None) or err.__class__.__name__}",
                       e.args[0].span)
            return None
        files[spec_relative(spec_dir, rel)] = text
        key = name or f"file:{rel}"
        return _analyse(key, text, rel, full if not os.path.isabs(rel) else rel, 1, 1, e.span, sink, display=_display_path(spec_path, rel))
    sink.error("E107", "a template is a string (inline) or file(\"path\")", e.span)
    return None


def _display_path(spec_path: str, rel: str) -> str:
    return os.path.normpath(os.path.join(os.path.dirname(spec_path), rel))


def _analyse(key, source, rel, full, line, col, span, sink, display=None) -> LoadedTemplate | None:
    display = display or full
    env = environment()
    try:
        parsed = env.parse(source)
        variables = sorted(meta.find_undeclared_variables(parsed))
    except jinja2.TemplateSyntaxError as err:
        eline = line + (err.lineno or 1) - 1
        sink.error("E302", f"template syntax error: {err.message}", Span(display, eline, 1 if err.lineno != 1 else col, eline, (1 if err.lineno != 1 else col) + 1))
        return None
    except Exception as err:  # jinja may raise assertion errors on odd input
        sink.error("E302", f"template error: {err}", span)
        return None
    lt = LoadedTemplate(key, source, rel, display, line, col, variables, span)
    try:
        problems = static_problems(parsed)
        lt.fields = field_uses(parsed)
        lt.guarded = guarded_names(parsed)
    except RecursionError:
        problems = []  # an expression nested too deeply to analyse; the render limits still apply
    for lineno, needle, message in problems:
        sink.error("E305", message, _locate(lt, lineno, needle), SANDBOX_HINT)
    return lt


SANDBOX_HINT = "templates render in a sandbox: no private attributes, no changes to data, bounded time and size"


def _locate(t: LoadedTemplate, lineno: int, needle: str) -> Span:
    """Span of ``needle`` on template line ``lineno`` (the line's start when absent)."""
    lines = t.source.splitlines() or [""]
    text = lines[min(max(lineno, 1), len(lines)) - 1]
    idx = text.find(needle) if needle else -1
    col = idx + 1 if idx >= 0 else 1
    width = len(needle) if idx >= 0 else 1
    line = t.origin_line + lineno - 1
    if lineno == 1:
        col += t.origin_col - 1
    return Span(t.display_path, line, col, line, col + width)


def field_location(t: LoadedTemplate, lineno: int, var: str, path: tuple[str, ...], at: int) -> Span:
    """Span of field ``path[at]`` in the chain ``var.path...`` on template line ``lineno``
    (``.name`` or ``["name"]``), searched after ``var`` and the fields before it."""
    lines = t.source.splitlines() or [""]
    text = lines[min(max(lineno, 1), len(lines)) - 1]
    pos = _find_word(text, var)
    col = width = 0
    if pos >= 0:
        pos += len(var)
        for i, name in enumerate(path[: at + 1]):
            m = re.compile(rf"\s*(?:\.\s*({re.escape(name)})(?![A-Za-z0-9_])|\[\s*['\"]({re.escape(name)})['\"]\s*\])"
                           ).search(text, pos)
            if m is None:
                break
            pos = m.end()
            if i == at:
                group = 1 if m.group(1) is not None else 2
                col, width = m.start(group) + 1, len(name)
    if not col:
        return _locate(t, lineno, path[at])
    line = t.origin_line + lineno - 1
    if lineno == 1:
        col += t.origin_col - 1
    return Span(t.display_path, line, col, line, col + width)


def variable_location(t: LoadedTemplate, var: str) -> Span:
    """Span of the first use of `var` inside the template text."""
    env = environment()
    try:
        for lineno, kind, value in env.lex(t.source):
            if kind == "name" and value == var:
                # lex gives lines but not columns: find the column on that line
                text_line = t.source.splitlines()[lineno - 1] if t.source.splitlines() else ""
                idx = _find_word(text_line, var)
                line = t.origin_line + lineno - 1
                col = (idx + 1) if idx >= 0 else 1
                if lineno == 1:
                    col += t.origin_col - 1
                return Span(t.display_path, line, col, line, col + len(var))
    except Exception:
        pass
    return Span(t.display_path, t.origin_line, t.origin_col, t.origin_line, t.origin_col + 1)


def _find_word(line: str, word: str) -> int:
    m = re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", line)
    return m.start() if m else -1


# Names Jinja2 provides itself; never report them as missing.
JINJA_GLOBALS = {"range", "dict", "lipsum", "cycler", "joiner", "namespace", "loop", "true", "false", "none", "True", "False", "None"}
