"""`compile --format mermaid` and `dot` show a game's routes, the tournaments and judges
they send groups to and the judge roles those consult, as the text outline does."""

from __future__ import annotations

import re

import pytest

from askspec.ir import render
from askspec.lang.compiler import compile_file

from lang_helpers import ROOT, run_cli

ARENA = ROOT / "specs" / "reasoning_arena.ask"


@pytest.fixture(scope="module")
def arena():
    res = compile_file(str(ARENA))
    assert res.ok
    return res.ir


def _labels(graph: str, fmt: str) -> tuple[list[str], list[str]]:
    """Node labels and edge labels of a rendered graph."""
    if fmt == "dot":
        nodes = re.findall(r'\[label="((?:[^"\\]|\\.)*)", shape=', graph)
        edges = re.findall(r'-> \w+ \[label="((?:[^"\\]|\\.)*)"\]', graph)
        return [n.replace('\\"', '"') for n in nodes], [e.replace('\\"', '"') for e in edges]
    nodes = re.findall(r'^\s+g\d+n\d+(?:\(\[|\{|\[)"([^"]*)"', graph, re.M)
    edges = re.findall(r'-->\|"([^"]*)"\|', graph)
    return [n.replace("#quot;", '"') for n in nodes], [e.replace("#quot;", '"') for e in edges]


@pytest.mark.parametrize("fmt", ["dot", "mermaid"])
def test_graphs_show_routes_contests_and_judges(arena, fmt):
    graph = render.to_dot(arena) if fmt == "dot" else render.to_mermaid(arena)
    nodes, edges = _labels(graph, fmt)
    text = render.to_text(arena)
    assert "route policy (group of 8)" in nodes
    assert "judge role judge" in nodes
    # every contest a route can reach, with the bound the text outline states for it
    for t in arena.tournaments:
        bound = render.judge_calls_per_group(t, 8)
        assert f"tournament {t.name}, {t.pairing}: rewards policy (≤ {bound} judge calls)" in nodes
    for j in arena.judges:
        assert f"judge {j.name}: rewards policy (≤ {8 * (1 + j.retries)} judge calls)" in nodes
    # every arm of the route, as the text outline writes its condition
    (route,) = arena.games[0].routes
    for arm in route.arms:
        assert render.arm_text(arm) in text
        assert (f"when {render.expr_text(arm.cond)}" if arm.cond is not None else "else") in edges
    assert edges.count("asks") == len(arena.tournaments) + len(arena.judges)
    assert "group finished" in edges


def test_the_cli_prints_the_routes(tmp_path):
    out = run_cli("compile", str(ARENA), "--format", "mermaid")
    assert out.returncode == 0 and "judge role judge" in out.stdout and "route policy" in out.stdout
