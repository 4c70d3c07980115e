"""How a value from a spec (or the command line) enters a generated job file: one
escaping function per target language, registered as the templates' filters.

The job folder's Python is imported on every Ray worker and its shell scripts are run,
so a spec's text — its file name, a model's weights string, a role's name — must reach
them as data, never as code. Each function returns `Code`, and the job's Jinja
environment refuses to emit any other string (`finalize`): a template that interpolates
a value without one of these filters fails at render time (the tests render every
template), instead of writing a script that runs what a file name says.
"""

from __future__ import annotations

import re
import shlex

from askspec.terminal import printable

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# line breaks that str.splitlines honours and printable() keeps (it escapes the C0/C1 ones)
_LINE_SEPARATORS = {"\u2028": "\\u2028", "\u2029": "\\u2029"}


class Code(str):
    """Text that is safe to write verbatim where the template put it."""


class Unrepresentable(ValueError):
    """A value no generated file can carry as written (a NUL in a command-line argument)."""


def line(value: object) -> Code:
    """One line of inert text, for a `#` comment (shell or Python) or the README's prose:
    line breaks and control characters shown as escapes (`\\n`, `\\x1b`), and characters
    UTF-8 cannot encode (a file name's undecodable bytes) as `\\udcff`."""
    text = printable(str(value), single_line=True)
    for sep, shown in _LINE_SEPARATORS.items():
        text = text.replace(sep, shown)
    return Code(text.encode("utf-8", "backslashreplace").decode("utf-8"))


def py(value: str | int | float | bool | None) -> Code:
    """A Python literal (`repr`): the generated module reads back exactly `value`."""
    if not isinstance(value, (str, int, float, bool, type(None))):
        raise TypeError(f"no Python literal for a {type(value).__name__}")
    return Code(repr(value))


def py_doc(value: object) -> Code:
    """Text inside a `\"\"\"` docstring: one line (`line`), with backslashes and quotes
    escaped so that neither `\"\"\"` nor an escape such as `\\N` can end or break it."""
    return Code(line(value).replace("\\", "\\\\").replace('"', '\\"'))


def sh(value: object) -> Code:
    """One shell word (`shlex.quote`): the command receives exactly `value`."""
    text = str(value)
    if "\0" in text:
        raise Unrepresentable(f"{line(text)} contains a NUL character, which no command-line argument can carry")
    return Code(shlex.quote(text))


def sh_name(value: object) -> Code:
    """A shell variable name or a bare word inside double quotes: only an identifier
    (what the grammar's names are) passes; anything else is a generator bug."""
    text = str(value)
    if not _NAME.fullmatch(text):
        raise ValueError(f"not an identifier, cannot be a shell name: {line(text)}")
    return Code(text)


FILTERS = {"line": line, "py": py, "py_doc": py_doc, "sh": sh, "sh_name": sh_name}


def finalize(value: object) -> object:
    """The job environment's `finalize`: every `{{ ... }}` must come out of a filter
    above; numbers pass (they print as digits)."""
    if isinstance(value, Code) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise TypeError(f"unescaped {type(value).__name__} {line(value)} in a job template: "
                    f"pass it through one of the filters {', '.join(FILTERS)}")
