"""The template sandbox: Jinja2's immutable sandbox, plus bounds on the time and memory a
render may use. The checker parses templates in it and the runtime renders them in it,
so what `check` accepts is exactly what runs.

A template is code written by a spec's author, so a shared spec must not be able to hang
or exhaust a run: ``{{ 9 ** 99999999 }}``, ``{{ 'a' * 10**10 }}``, nested loops over
``range(100000)``, a macro calling itself, ``'x'.center(10**9)``. Every place where
Jinja runs template logic passes through this environment (operators, calls, attribute
and item access, filters, tests, loop iterations, joins of output), and each checks:

- time: a render stops after ``RENDER_SECONDS``;
- size: no string or list built by the template exceeds ``MAX_CHARS`` characters (items),
  the rendered text included; widths and paddings (``center``, ``'%9999d'``,
  ``'{:>9999}'``) are at most ``MAX_WIDTH``; integers at most ``MAX_INT_BITS`` bits;
- counts: at most ``MAX_ITERATIONS`` loop iterations per render, ``range`` at most
  ``MAX_RANGE`` numbers; recursion ends with an error, not a crash.

Operations whose cost or output is a product of their inputs (repetition, ``replace``,
``join``, ``indent``, ``wordwrap``, ``sum`` of lists, ...) are checked *before* they run;
everything else is checked as it goes. A render past a limit raises
``TemplateLimitError`` (a Jinja ``SecurityError``), which the engine records as the
session's error; the run goes on.

``template_checks.static_problems`` finds at check time (E305) what is certain to fail
here, using the same checks.
"""

from __future__ import annotations

import contextvars
import functools
import re
import string
import time
import types
from typing import Any, Callable, Iterable, Iterator, cast

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter, SecurityError
from jinja2.utils import generate_lorem_ipsum
from markupsafe import Markup

RENDER_SECONDS = 2.0
MAX_CHARS = 1_000_000
MAX_WIDTH = 100_000
MAX_INT_BITS = 10_000
MAX_ITERATIONS = 1_000_000
MAX_RANGE = 100_000


class TemplateLimitError(SecurityError):
    """A render went past one of the sandbox's limits (the message says which)."""


# ----------------------------------------------------------------- the per-render budget


class _Budget:
    __slots__ = ("deadline", "iterations", "ops")

    def __init__(self) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.iterations = 0
        self.ops = 0



_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("askspec_template_budget", default=None)


def _budget() -> _Budget:
    # Outside a render (Jinja folding constants while compiling) a fresh budget still
    # applies every per-operation check.
    return _BUDGET.get() or _Budget()


def _tick() -> None:
    """Called by every guarded operation; reads the clock every 32nd time (each operation
    is bounded by its own checks, and reading it every time tripled a render's cost)."""
    b = _BUDGET.get()
    if b is not None:
        b.ops += 1
        if not b.ops & 31 and time.monotonic() > b.deadline:
            raise TemplateLimitError(f"rendering took longer than {RENDER_SECONDS:g} s (the limit)")


def _too_big(what: str, n: int, limit: int = MAX_CHARS) -> TemplateLimitError:
    return TemplateLimitError(f"{what} would be {n:,} long, over the limit of {limit:,}")


def _check_size(v: Any, what: str = "a value") -> Any:
    t = type(v)
    if t is str or t is list or t is tuple or t is dict or t is bytes or isinstance(v, (str, bytes, list, tuple, dict)):
        if len(v) > MAX_CHARS:
            raise _too_big(what, len(v))
    elif isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
        raise TemplateLimitError(f"{what} would be an integer of {v.bit_length():,} bits, over the limit of {MAX_INT_BITS:,}")
    return v


def _check_width(n: Any, what: str) -> None:
    if isinstance(n, int) and not isinstance(n, bool) and n > MAX_WIDTH:
        raise TemplateLimitError(f"{what} {n:,} is over the limit of {MAX_WIDTH:,}")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d+|\*)?(?:\.(\d+|\*))?[hlL]?[diouxXeEfFgGcrsa%]")


@functools.lru_cache(maxsize=1024)
def _percent_widths(text: str) -> tuple[int, bool]:
    """The largest literal width or precision in a %-format, and whether one is ``*``."""
    widest, star = 0, False
    for m in _PERCENT_SPEC.finditer(text):
        for g in m.groups():
            if g == "*":
                star = True
            elif g:
                widest = max(widest, int(g) if len(g) < 12 else MAX_WIDTH + 1)
    return widest, star


def _check_percent_format(fmt: str | bytes, args: Any) -> None:
    """``fmt % args``: widths and precisions, literal or ``*``, are bounded."""
    widest, star = _percent_widths(fmt.decode("latin-1") if isinstance(fmt, bytes) else str(fmt))
    _check_width(widest, "a format width")
    if star:
        for a in (args if isinstance(args, tuple) else (args,)):
            _check_width(a, "a format width")


def _check_format_spec(spec: str) -> None:
    for digits in re.findall(r"\d+", spec):
        _check_width(int(digits[:12]) if len(digits) < 12 else MAX_WIDTH + 1, "a format width")


# ----------------------------------------------------------------- checked operations


def checked_binop(op: str, left: Any, right: Any) -> Any:
    """``left op right`` for the operators whose result can outgrow their inputs."""
    if op == "%":
        if isinstance(left, (str, bytes)):
            _check_percent_format(left, right)
            return _check_size(left % right, "a formatted string")
        return left % right
    seqs = (str, bytes, list, tuple)
    ints = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if op == "*":
        if isinstance(left, seqs) and ints(right) or isinstance(right, seqs) and ints(left):
            seq, n = (left, right) if isinstance(left, seqs) else (right, left)
            if len(seq) * max(n, 0) > MAX_CHARS:
                raise _too_big("a repetition", len(seq) * n)
        elif ints(left) and ints(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
            raise TemplateLimitError(f"a product would be an integer over {MAX_INT_BITS:,} bits (the limit)")
        return _check_size(left * right, "a repetition")
    if op == "**":
        if ints(left) and ints(right) and right > 0 and abs(left) > 1:
            bits = right * (abs(left).bit_length() - 1)
            if bits > MAX_INT_BITS:
                raise TemplateLimitError(f"a power would be an integer of about {bits:,} bits, over the limit of {MAX_INT_BITS:,}")
        return _check_size(left ** right, "a power")
    if op == "+":
        if isinstance(left, seqs) and isinstance(right, seqs) and len(left) + len(right) > MAX_CHARS:
            raise _too_big("a concatenation", len(left) + len(right))
        return _check_size(left + right, "a sum")
    raise AssertionError(op)  # pragma: no cover - only the operators above are intercepted


def _join_parts(parts: Iterable[Any]) -> str:
    """``"".join(str(p) for p in parts)``, refusing as soon as it would be too long."""
    # no clock here: what yields the parts (loops, calls, filters) reads it
    strs: list[str] = []
    append, total = strs.append, 0
    for p in parts:
        if type(p) is not str:
            p = str(p)
        total += len(p)
        if total > MAX_CHARS:
            raise _too_big("the text", total)
        append(p)
    return "".join(strs)


def _count_lines(s: str) -> int:
    return s.count("\n") + 1


# Methods of str/bytes that are safe for any input (linear, output no larger than input).
_PLAIN_STR_METHODS = {
    "capitalize", "casefold", "count", "endswith", "find", "index", "isalnum", "isalpha", "isascii",
    "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle",
    "isupper", "lower", "lstrip", "partition", "removeprefix", "removesuffix", "rfind", "rindex",
    "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title",
    "upper", "encode", "decode", "hex",
}


def _occurrences(s: str | bytes, part: str | bytes) -> int:
    """How often `part` occurs in `s`; 0 when one is text and the other bytes (the call
    itself then fails with Python's own TypeError)."""
    if isinstance(s, str) and isinstance(part, str):
        return s.count(part)
    if isinstance(s, bytes) and isinstance(part, bytes):
        return s.count(part)
    return 0


def check_str_method(name: str, s: str | bytes, args: tuple, kwargs: dict) -> None:
    """Refuse a call on a str/bytes method whose output the inputs could blow up."""
    if name in _PLAIN_STR_METHODS:
        return
    if name in ("center", "ljust", "rjust", "zfill"):
        _check_width(args[0] if args else kwargs.get("width"), f"{name} width")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        tabs = _occurrences(s, "\t" if isinstance(s, str) else b"\t")
        if isinstance(size, int) and tabs * max(size, 0) + len(s) > MAX_CHARS:
            raise _too_big("expandtabs' result", tabs * size + len(s))
    elif name == "replace":
        old, new = (list(args) + [kwargs.get("old"), kwargs.get("new")])[:2]
        if isinstance(old, (str, bytes)) and isinstance(new, (str, bytes)) and len(new) > len(old):
            hits = len(s) + 1 if not old else _occurrences(s, old)
            if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                hits = min(hits, args[2])
            if len(s) + hits * (len(new) - len(old)) > MAX_CHARS:
                raise _too_big("replace's result", len(s) + hits * (len(new) - len(old)))
    elif name == "join":
        pass  # checked by the caller, which materialises the items
    elif name in ("format", "format_map"):
        if isinstance(s, str):  # literal widths; substituted ones are checked per field
            try:
                specs = [spec for _, _, spec, _ in string.Formatter().parse(s) if spec]
            except ValueError:
                specs = []  # a malformed format string fails by itself
            for spec in specs:
                _check_format_spec(spec)
    else:
        raise TemplateLimitError(f"the string method {name!r} is not available in templates")


# ----------------------------------------------------------------- filters and tests


def _value_index(func: Callable) -> int:
    """Position of the filtered value among a filter's arguments (after a context one)."""
    from jinja2.utils import _PassArg

    return 1 if _PassArg.from_obj(func) is not None else 0


def precheck_filter(name: str, value: Any, args: tuple, kwargs: dict) -> None:
    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "center":
        _check_width(arg(0, "width", 80), "center width")
    elif name == "indent":
        width = arg(0, "width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        _check_width(pad, "indent width")
        if isinstance(value, str) and _count_lines(value) * pad + len(value) > MAX_CHARS:
            raise _too_big("the indented text", _count_lines(value) * pad + len(value))
    elif name == "replace":
        old, new = arg(0, "old"), arg(1, "new")
        if isinstance(value, str) and isinstance(old, str) and isinstance(new, str):
            check_str_method("replace", value, (old, new) + ((arg(2, "count"),) if arg(2, "count") is not None else ()), {})
    elif name == "format":
        if isinstance(value, str):
            _check_percent_format(value, tuple(args) or kwargs)
    elif name in ("batch", "slice"):
        n = arg(0, "linecount" if name == "batch" else "slices")
        if isinstance(n, int) and n > MAX_RANGE:
            raise TemplateLimitError(f"{name}({n:,}) is over the limit of {MAX_RANGE:,}")
    elif name == "wordwrap":
        width = arg(0, "width", 79)
        wrap = arg(2, "wrapstring", "\n") or "\n"
        if isinstance(value, str) and isinstance(width, int) and isinstance(wrap, str):
            lines = len(value) // max(width, 1) + _count_lines(value)
            if len(value) + lines * len(wrap) > MAX_CHARS:
                raise _too_big("the wrapped text", len(value) + lines * len(wrap))
    elif name == "tojson":
        indent = arg(0, "indent")
        if isinstance(indent, int) and indent > 64:
            raise TemplateLimitError(f"tojson indent {indent} is over the limit of 64")
    elif name == "sum":
        start = arg(1, "start", 0)
        if not isinstance(start, (int, float)):
            raise TemplateLimitError("sum of lists or strings is not available in templates (use join)")
    elif name == "striptags":
        if isinstance(value, str) and value.count("<!--") * len(value) > 10 * MAX_CHARS:
            raise TemplateLimitError("striptags on this text would take too long (many '<!--')")


# Filters whose output can be far larger than their input, or whose cost can be more
# than linear in it: checked before they run. The others only read the clock.
_PRECHECKED_FILTERS = {"center", "indent", "replace", "format", "batch", "slice", "wordwrap", "tojson", "sum",
                       "striptags", "join"}


def _guard_filter(name: str, func: Callable) -> Callable:
    at = _value_index(func)
    if name not in _PRECHECKED_FILTERS:
        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            _tick()
            return func(*args, **kwargs)

        return timed

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        value, rest = (args[at] if len(args) > at else None), args[at + 1:]
        precheck_filter(name, value, rest, kwargs)
        if name == "join" and value is not None and not isinstance(value, (str, bytes)):
            # materialise once, so the length check sees every item and no generator is consumed twice
            items = list(value)
            sep = rest[0] if rest else kwargs.get("d", "")
            if isinstance(sep, str) and len(items) * len(sep) > MAX_CHARS:
                raise _too_big("the joined text", len(items) * len(sep))
            args = args[:at] + (items,) + args[at + 1:]
        return _check_size(func(*args, **kwargs), f"the result of the {name!r} filter")

    return guarded


def _guard_test(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        return func(*args, **kwargs)

    return guarded


def safe_range(*args: int) -> range:
    rng = range(*args)
    if len(rng) > MAX_RANGE:
        raise TemplateLimitError(f"range of {len(rng):,} numbers is over the limit of {MAX_RANGE:,}")
    return rng


def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    if isinstance(n, int) and isinstance(max, int) and n * max > MAX_RANGE:
        raise TemplateLimitError(f"lipsum of {n:,} paragraphs is over the limit")
    return generate_lorem_ipsum(n, html, min, max)


def _loop_guard(iterable: Any) -> Iterator[Any]:
    """Wraps the iterable of every ``{% for %}``: counts iterations and checks the clock."""
    budget = _budget()
    for item in iterable:
        budget.iterations += 1
        if budget.iterations > MAX_ITERATIONS:
            raise TemplateLimitError(f"loops ran more than {MAX_ITERATIONS:,} iterations (the limit)")
        if not budget.iterations & 31 and time.monotonic() > budget.deadline:
            raise TemplateLimitError(f"rendering took longer than {RENDER_SECONDS:g} s (the limit)")
        yield item


LOOP_GUARD = "askspec_loop_guard"


class _BoundedFormatter(SandboxedFormatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        _check_format_spec(format_spec)
        return _check_size(super().format_field(value, format_spec), "a formatted field")


class _BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:  # the `~` operator
        self.write("environment.askspec_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandboxedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox with the limits described in the module docstring."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.globals["range"] = safe_range
        self.globals["lipsum"] = lipsum
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.filters[LOOP_GUARD] = _loop_guard
        # jinja leaves `tests` unannotated, so mypy infers builtins.function, which is not a Callable
        tests = cast(dict[str, Callable[..., Any]], self.tests)
        self.tests = {name: _guard_test(f) for name, f in tests.items()}

    # every output join: the rendered text, macro bodies, {% set %} and {% filter %} blocks
    def concat(self, parts: Iterable[Any]) -> str:
        if _BUDGET.get() is not None:
            return _join_parts(parts)
        token = _BUDGET.set(_Budget())  # a render starts here
        try:
            return _join_parts(parts)
        except RecursionError:
            raise TemplateLimitError("the template recurses too deeply (a macro calling itself?)") from None
        except MemoryError:
            raise TemplateLimitError("the template ran out of memory") from None
        finally:
            _BUDGET.reset(token)

    def askspec_concat(self, parts: tuple) -> str:
        return _join_parts(parts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        return checked_binop(operator, left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _tick()
        receiver = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(receiver, (str, bytes)) and isinstance(__obj, (types.BuiltinMethodType, types.MethodType)):
            check_str_method(name, receiver, args, kwargs)
            if name == "join" and args and not isinstance(args[0], (str, bytes)):
                items = list(args[0])
                if sum(len(x) if isinstance(x, (str, bytes)) else 0 for x in items) + len(items) * len(receiver) > MAX_CHARS:
                    raise _too_big("the joined text", len(items) * len(receiver))
                args = (items,) + args[1:]
        return _check_size(super().call(__context, __obj, *args, **kwargs), "a call's result")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None or not isinstance(value.__self__, str) or isinstance(value.__self__, Markup):
            return wrapped
        f_self, is_map = value.__self__, value.__name__ == "format_map"
        formatter = _BoundedFormatter(self)

        def bounded(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                return _check_size(formatter.vformat(f_self, (), args[0]), "a formatted string")
            return _check_size(formatter.vformat(f_self, args, kwargs), "a formatted string")

        return functools.update_wrapper(bounded, value)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, LOOP_GUARD, [], [], None, None, lineno=loop.iter.lineno)
        return tree


@functools.lru_cache(maxsize=1)
def environment() -> BoundedSandboxedEnvironment:
    """The one sandbox that `check` parses in and the runtime renders in."""
    return BoundedSandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


def render(template: jinja2.Template, variables: dict[str, Any]) -> str:
    """Render ``template`` with exactly ``variables`` (globals included by the caller) in
    one budget; TemplateLimitError past a limit."""
    return template.environment.concat(template.root_render_func(template.new_context(variables, shared=True)))


