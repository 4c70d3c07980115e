"""docs/language.md stays in step with the compiler's registries."""

from __future__ import annotations

import re
import typing

from askspec.ir import model as ir
from askspec.lang.blocks import ALGORITHMS, SCHEDULES
from askspec.diagnostics import CODES
from askspec.lang.exprs import BUILTINS

from lang_helpers import ROOT

DOC = (ROOT / "docs" / "language.md").read_text()


def test_every_diagnostic_code_is_documented() -> None:
    rows = dict(re.findall(r"^\| (E\d{3}|W\d{3}) \| ([^|]+) \|", DOC, re.M))
    assert set(rows) == set(CODES)
    for code, (_, description) in CODES.items():
        assert rows[code].strip().replace("`", "") == description.replace("`", ""), code


def test_every_builtin_is_documented() -> None:
    documented = set(re.findall(r"`(\w+)`", DOC.split("## Built-in functions")[1].split("## Rewards")[0]))
    assert set(BUILTINS) <= documented, sorted(set(BUILTINS) - documented)


def test_reply_parsers_algorithms_and_schedules_are_documented() -> None:
    for kind in typing.get_args(ir.ReplyParser.model_fields["kind"].annotation):
        assert f"`{kind}" in DOC, kind
    for name in ALGORITHMS | SCHEDULES:
        assert f"`{name}`" in DOC, name
