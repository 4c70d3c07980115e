"""Renderers: the text outline states per-role call bounds; DOT and Mermaid are
well formed (checked structurally: the `dot` binary is not required)."""

from __future__ import annotations

import re
from pathlib import Path

from askspec.ir import render
from askspec.lang.compiler import compile_file

from lang_helpers import ROOT


def ir_of(path: Path):
    res = compile_file(str(path))
    assert res.ok
    return res.ir


def _balanced_outside_quotes(text: str, pairs: dict[str, str]) -> bool:
    stack, quoted, escaped = [], False, False
    for ch in text:
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
            continue
        if ch == '"':
            quoted = True
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch in pairs.values():
            if not stack or stack.pop() != ch:
                return False
    return not stack and not quoted


def test_text_states_call_bounds() -> None:
    text = render.to_text(ir_of(ROOT / "specs" / "ask_e.ask"))
    assert "model calls per session (upper bound, recovery retries included):" in text
    # 4 probes + 1 final, each with one recovery retry; boundaries 4 probes + 1 final
    assert "    questioner: ≤ 10" in text
    assert "    boundary_a: ≤ 5" in text and "    answer_key: ≤ 1" in text


def test_text_states_judge_bounds_per_group() -> None:
    text = render.to_text(ir_of(ROOT / "specs" / "reasoning_arena.ask"))
    # the dearest arm: round robin C(8, 2) = 28 matches, 1 + 2 retries each
    assert "judge: ≤ 84 per group of 8 (route tournament arena_rr, round_robin)" in text
    assert render.judge_calls_per_group(ir_of(ROOT / "specs" / "reasoning_arena.ask").tournaments[0], 8) == 18 * 3


def test_every_spec_renders(spec: Path) -> None:
    exp = ir_of(spec)
    text = render.to_text(exp)
    for g in exp.games:
        assert f"game {g.name}" in text
        for role, n in g.call_bounds.items():
            assert f"    {role}: ≤ {n}" in text


def test_dot_well_formed(spec: Path) -> None:
    dot = render.to_dot(ir_of(spec))
    assert dot.startswith("digraph ") and dot.rstrip().endswith("}")
    assert _balanced_outside_quotes(dot, {"{": "}", "[": "]"})
    declared = set(re.findall(r"^\s+(g\d+n\d+) \[label=", dot, re.M))
    for a, b in re.findall(r"^\s+(g\d+n\d+) -> (g\d+n\d+)", dot, re.M):
        assert a in declared and b in declared


def test_mermaid_well_formed(spec: Path) -> None:
    mm = render.to_mermaid(ir_of(spec))
    lines = mm.splitlines()
    assert lines[0] == "flowchart TD"
    assert sum(ln.strip().startswith("subgraph ") for ln in lines) == sum(ln.strip() == "end" for ln in lines)
    node = re.compile(r'^\s+(g\d+n\d+)(\(\[|\{|\[)"[^"]*"(\]\)|\}|\])$')
    declared = {m.group(1) for ln in lines if (m := node.match(ln))}
    for ln in lines:
        if "-->" in ln:
            a, b = re.match(r"^\s+(g\d+n\d+) -->(?:\|\"[^\"]*\"\|)? (g\d+n\d+)$", ln).groups()
            assert a in declared and b in declared
    assert _balanced_outside_quotes(mm, {"{": "}", "[": "]", "(": ")"})
