"""The IR as the contract with the runtime: JSON round trip and a content hash that
identifies the experiment (stable, blind to layout, sensitive to meaning and prompts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from askspec.ir import canonical
from askspec.ir.model import Experiment
from askspec.lang.compiler import compile_file, compile_source

from lang_helpers import ROOT, run_cli


def compiled(path: Path, text: str | None = None, **overrides: str) -> Experiment:
    res = compile_source(str(path), text, overrides) if text is not None else compile_file(str(path), overrides)
    assert res.ok, [d.message for d in res.sink.items]
    return res.ir


def test_json_round_trip(spec: Path) -> None:
    exp = compiled(spec)
    text = canonical.to_json(exp)
    back = canonical.from_json(text)
    assert back == exp
    assert canonical.canonical_json(back) == canonical.canonical_json(exp)
    assert canonical.experiment_hash(back) == canonical.experiment_hash(exp)
    assert json.loads(text)["hash"] == canonical.experiment_hash(exp)


def test_canonical_json_has_no_spans(spec: Path) -> None:
    assert '"span"' not in canonical.canonical_json(compiled(spec))
    assert '"span"' in canonical.to_json(compiled(spec))  # the tool JSON keeps them


def test_hash_stable_across_processes() -> None:
    first = run_cli("compile", "specs/ask_e.ask", "--format", "hash")
    second = run_cli("compile", "specs/ask_e.ask", "--format", "hash")
    assert first.returncode == 0 and len(first.stdout.strip()) == 64
    assert first.stdout == second.stdout
    assert first.stdout.strip() == canonical.experiment_hash(compiled(ROOT / "specs" / "ask_e.ask"))


def test_hash_ignores_whitespace_and_comments(spec: Path) -> None:
    text = spec.read_text()
    noisy = "# a new comment\n\n" + text.replace("\n", "\n\n").replace(" = ", "   =   ") + "\n// trailing\n"
    assert canonical.experiment_hash(compiled(spec, noisy)) == canonical.experiment_hash(compiled(spec, text))


def test_hash_changes_with_a_constant() -> None:
    spec = ROOT / "specs" / "ask_e.ask"
    text = spec.read_text()
    changed = text.replace("param alpha: number = 1.0", "param alpha: number = 0.5")
    assert changed != text
    assert canonical.experiment_hash(compiled(spec, changed)) != canonical.experiment_hash(compiled(spec, text))


def test_hash_changes_with_a_prompt_file(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    spec = tmp_path / "specs" / "ask_e.ask"
    before = canonical.experiment_hash(compiled(spec))
    prompt = tmp_path / "specs" / "prompts" / "ask_e" / "grade_system.j2"
    prompt.write_text(prompt.read_text() + "Be brief.\n")
    assert canonical.experiment_hash(compiled(spec)) != before


def test_set_override_changes_hash_and_type_checks() -> None:
    spec = ROOT / "specs" / "ask_e.ask"
    default = compiled(spec)
    two = compiled(spec, probes="2")
    assert two.param_values()["probes"] == 2
    assert canonical.experiment_hash(two) != canonical.experiment_hash(default)
    assert two.games[0].call_bounds["questioner"] < default.games[0].call_bounds["questioner"]
    bad = compile_file(str(spec), {"probes": '"x"'})
    assert not bad.ok and [d.code for d in bad.sink.items] == ["E111"]
    same = compiled(spec, probes="4")
    assert canonical.experiment_hash(same) == canonical.experiment_hash(default)
