"""The engine's prompt templates: compiled once, rendered in the checker's sandbox, and
not rendered again for inputs they were already rendered with.

A session's prompt is a function of the variables its template uses: the same template
with the same values gives the same text (the sandbox has no clock, files or state that
outlives a render), so a render is memoised by those values when they are plain values
(str, int, bool, None: hashable, and rendering the same for equal keys — floats are left
out, 0.0 and -0.0 being equal keys that render differently) and the template draws no
random numbers (the `random` filter, `lipsum()`). Model output only ever enters a
template as a variable's value, never as template source, cached or not."""

from __future__ import annotations

from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError

from askspec.ir import model as ir
# the checker's sandboxed environment: templates render exactly as they were checked,
# within the sandbox's time and size limits
from askspec.lang.sandbox import environment as template_environment
from askspec.lang.sandbox import render as render_template

from askspec.runtime.engine.state import SessionFailed

CACHE_ENTRIES = 4096  # renders memoised per engine; the memo starts over when full
CACHE_CHARS = 1 << 16  # neither an input string nor a rendered text longer than this is kept
_RANDOM_FILTERS = frozenset({"random"})
_RANDOM_NAMES = frozenset({"lipsum"})


class Prompts:
    """The templates of one experiment, by key, and a memo of their renders."""

    def __init__(self, templates: dict[str, ir.Template]) -> None:
        self.templates = templates
        # key -> (compiled template, its globals, the variables it uses, whether it is
        # memoisable, _ABSENT once per variable)
        self._compiled: dict[str, tuple[jinja2.Template, dict[str, Any], tuple[str, ...], bool, tuple[Any, ...]]] = {}
        self._memo: dict[tuple, str] = {}

    def compiled(self, key: str) -> tuple[jinja2.Template, dict[str, Any], tuple[str, ...], bool, tuple[Any, ...]]:
        """The compiled template, its globals, the variables it uses (from the IR),
        whether its renders may be memoised, and a placeholder per variable for those the
        context lacks."""
        hit = self._compiled.get(key)
        if hit is None:
            source = self.templates[key].source
            env = template_environment()
            t = env.from_string(source)
            wanted = tuple(self.templates[key].variables)
            hit = self._compiled[key] = (t, dict(t.globals), wanted, not _draws_random(env.parse(source)),
                                         (_ABSENT,) * len(wanted))
        return hit

    def label(self, key: str) -> str:
        """The template as an error names it: an inline one by its spec file:line:col."""
        t = self.templates.get(key)
        return ir.template_label(key, t.span if t is not None else None)

    def render(self, key: str, ctx: dict[str, Any]) -> str:
        """The template `key` rendered with the variables it uses from `ctx`; a template
        that fails (undefined variable, sandbox limit, an error in its logic) fails the
        session."""
        t, globals_, wanted, memoisable, absent = self._compiled.get(key) or self.compiled(key)
        values = tuple(map(ctx.get, wanted, absent))  # ctx.get(name, _ABSENT) for each
        memo_key: tuple | None = None
        if memoisable:
            types = tuple(map(type, values))  # exact types: a subclass may render as it likes
            if _PLAIN.issuperset(types) and (str not in types or _short_strings(values)):
                # the type goes in the key: 1, True and "1" are equal or alike, not the same text
                memo_key = (key, values, types)
                hit = self._memo.get(memo_key)
                if hit is not None:
                    return hit
        # A shared context built from a small dict (only the variables the template uses)
        # skips Jinja's per-render copy of its globals; rendering is otherwise Template.render,
        # in the same sandboxed environment.
        parent = {**globals_, **{k: v for k, v in zip(wanted, values) if v is not _ABSENT}}
        try:
            text = render_template(t, parent)
        except jinja2.UndefinedError as e:
            raise SessionFailed(f"{self.label(key)}: {e.message}") from None
        except jinja2.TemplateError as e:
            raise SessionFailed(f"{self.label(key)}: {e}") from None
        except (SecurityError, TypeError, ValueError, ArithmeticError, LookupError) as e:
            raise SessionFailed(f"{self.label(key)}: {e.__class__.__name__}: {e}") from None
        if memo_key is not None and len(text) <= CACHE_CHARS:
            if len(self._memo) >= CACHE_ENTRIES:
                self._memo.clear()
            self._memo[memo_key] = text
        return text


class _Absent:
    """A variable the context does not have (rendered as undefined, as it always was)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()
_PLAIN = frozenset({str, int, bool, type(None), _Absent})


def _short_strings(values: tuple[Any, ...]) -> bool:
    """Whether no str among `values` is longer than CACHE_CHARS."""
    for v in values:
        if type(v) is str and len(v) > CACHE_CHARS:
            return False
    return True


def _draws_random(tree: nodes.Template) -> bool:
    """Whether a template's output may differ between two renders with the same values."""
    if any(f.name in _RANDOM_FILTERS for f in tree.find_all(nodes.Filter)):
        return True
    return any(n.name in _RANDOM_NAMES for n in tree.find_all(nodes.Name))
