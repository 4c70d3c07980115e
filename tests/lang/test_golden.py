"""Golden tests: one fixture per diagnostic code (tests/lang/golden/<CODE>_<slug>.ask,
with template files under golden/prompts/, --set overrides in <same>.set and a --profile
name in <same>.profile; without one every profile is checked, as `askspec check` does), compared
with the exact formatted output in <same>.expected.

Regenerate the expected files after an intended change with
    ASKSPEC_UPDATE_GOLDEN=1 python -m pytest tests/lang/test_golden.py
and review the diff.

Not covered: E999 (internal compiler error), which only a compiler bug can produce; the
property tests assert that it never appears.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_file
from askspec.diagnostics import CODES, format_diagnostic

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(GOLDEN.glob("*.ask"))
UNTESTABLE = {"E999"}
# E6xx and W6xx come from `compile --target openrlhf`; their goldens are tests/targets/golden
TARGET_CODES = {c for c in CODES if c.startswith(("E6", "W6"))}
# E7xx come from `askspec rescore` (E701, tests/commands/test_rescore.py: a spec compared with a recorded run's)
# and `compile --target verifiers` (E702-E709, tests/targets/test_verifiers_target.py)
TARGET_CODES |= {c for c in CODES if c.startswith("E7")}


def overrides(case: Path) -> dict[str, str]:
    sets = case.with_suffix(".set")
    if not sets.exists():
        return {}
    pairs = (line.split("=", 1) for line in sets.read_text().splitlines() if line.strip())
    return {k.strip(): v.strip() for k, v in pairs}


def profile(case: Path) -> str | None:
    chosen = case.with_suffix(".profile")
    return chosen.read_text().strip() if chosen.exists() else None


def diagnostics_text(case: Path) -> str:
    cwd = os.getcwd()
    os.chdir(GOLDEN)  # paths in the output are relative to the fixture folder
    try:
        chosen = profile(case)  # as `askspec check` does: without --profile, every profile is checked
        res = compile_file(case.name, overrides(case), chosen, all_profiles=chosen is None)
    finally:
        os.chdir(cwd)
    return "".join(format_diagnostic(d, res.sources) + "\n" for d in res.sink.sorted())


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_golden(case: Path) -> None:
    got = diagnostics_text(case)
    expected_file = case.with_suffix(".expected")
    if os.environ.get("ASKSPEC_UPDATE_GOLDEN"):
        expected_file.write_text(got)
    assert expected_file.exists(), f"missing {expected_file.name}; run with ASKSPEC_UPDATE_GOLDEN=1"
    assert got == expected_file.read_text()
    code = case.name.split("_", 1)[0]
    assert f"[{code}]" in got, f"{case.name} does not produce {code}"


def test_every_code_has_a_fixture() -> None:
    covered = {c.name.split("_", 1)[0] for c in CASES}
    missing = set(CODES) - covered - UNTESTABLE - TARGET_CODES
    assert not missing, f"diagnostic codes without a golden fixture: {sorted(missing)}"
    assert not covered - set(CODES), "fixtures named after unregistered codes"


def test_every_emitted_code_is_registered() -> None:
    """Each code the compiler source can emit is in CODES (so docs and goldens list it)."""
    src = Path(__file__).parents[2] / "askspec" / "lang"
    emitted = set()
    for f in src.glob("*.py"):
        emitted |= set(re.findall(r'"([EW]\d{3})"', f.read_text()))
    assert emitted <= set(CODES), sorted(emitted - set(CODES))


# The acceptance cases, pinned to line and column (the full text is in the .expected files).
@pytest.mark.parametrize("case,where", [
    ("E102_unknown_role", "E102_unknown_role.ask:6:9: error[E102]: unknown role 'questionr'"),
    ("E201_reward_type", "E201_reward_type.ask:6:16: error[E201]: a reward must be a number, found string"),
    ("E002_unclosed_block", "E002_unclosed_block.ask:3:17: error[E002]:"),
    ("E002_unclosed_at_eof", "E002_unclosed_at_eof.ask:4:8: error[E002]:"),
    ("E301_undefined_template_variable", "prompts/E301_probe.j2:3:30: error[E301]: template uses 'summary_a'"),
])
def test_acceptance_locations(case: str, where: str) -> None:
    assert any(line.startswith(where) for line in diagnostics_text(GOLDEN / f"{case}.ask").splitlines())
