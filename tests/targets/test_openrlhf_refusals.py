"""`compile --target openrlhf` refusals: one golden fixture per code (golden/<CODE>_<slug>.ask
with the exact output in <same>.expected), the five specs' refusals as docs/cluster.md
lists them, and the command line's handling of bad targets and output folders.

The job's build runs after the check where it passes (its refusals: a `micro_batch` no step
fits, E604; `--max-len` above the model's context, E609, which a fixture asks for with a
first line `# compile: --max-len N`).

Regenerate after an intended change with
    ASKSPEC_UPDATE_GOLDEN=1 python -m pytest tests/targets/test_openrlhf_refusals.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.lang.compiler import compile_file
from askspec.diagnostics import CODES, DiagnosticSink, format_diagnostic
from askspec.runtime.targets.openrlhf.check import check
from askspec.runtime.targets.openrlhf.generate import _build

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
CASES = sorted(GOLDEN.glob("*.ask"))
ROOT = HERE.parents[1]
CISPO = HERE / "specs" / "cispo.ask"
TARGET_CODES = {c for c in CODES if c.startswith(("E6", "W6"))}


def refusals(spec: Path, cwd: Path, substitutes: dict | None = None, sets: dict | None = None,
             profile: str | None = None) -> str:
    old = os.getcwd()
    os.chdir(cwd)  # paths in the output are relative to the fixture folder
    try:
        res = compile_file(os.path.relpath(spec, cwd), sets or {}, profile)
        assert res.ok, "the fixture must pass the language checks"
        sink = DiagnosticSink()
        plan = check(res.ir, res.sources, os.path.relpath(spec, cwd), substitutes or {}, sink)
        asked = re.match(r"# compile: --max-len (\d+)", spec.read_text())
        if plan is not None and not sink.has_errors:
            _build(res.ir, plan, os.path.relpath(spec, cwd), sink, int(asked.group(1)) if asked else None)
    finally:
        os.chdir(old)
    return "".join(format_diagnostic(d, res.sources) + "\n" for d in sink.sorted())


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_golden(case: Path) -> None:
    got = refusals(case, GOLDEN)
    expected = case.with_suffix(".expected")
    if os.environ.get("ASKSPEC_UPDATE_GOLDEN"):
        expected.write_text(got)
    assert got == expected.read_text()
    assert f"[{case.name.split('_', 1)[0]}]" in got


def test_every_target_code_has_a_fixture() -> None:
    assert {c.name.split("_", 1)[0] for c in CASES} == TARGET_CODES


def test_the_five_specs_refuse_as_documented() -> None:
    """docs/cluster.md's refusal table: every spec and code pair it lists is what the
    target says (and nothing else), with and without the documented substitution."""
    doc = (ROOT / "docs" / "cluster.md").read_text()
    table = doc.split("## What the five specs compile to")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+)\.ask`(?: `([^`]*)`)? \| ([^|]*) \|", table, re.M)
    assert len(rows) == 8, rows
    for name, flags, codes in rows:
        substitutes = dict(f.split("=") for f in re.findall(r"--substitute (\S+)", flags))
        sets = dict(f.split("=", 1) for f in re.findall(r"--set (\S+)", flags))
        profile = next(iter(re.findall(r"--profile (\S+)", flags)), None)
        got = refusals(ROOT / "specs" / f"{name}.ask", ROOT, substitutes, sets, profile)
        found = sorted(set(re.findall(r"error\[(E6\d\d)\]", got)))
        want = sorted(set(re.findall(r"E6\d\d", re.sub(r"\([^)]*\)", "", codes))))  # a note in brackets: other flags
        assert found == want, (name, flags, got)


def test_refused_spec_writes_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "job"
    assert main(["compile", str(GOLDEN / "E601_sft.ask"), "--target", "openrlhf", "-o", str(out)]) == 1
    assert "error[E601]" in capsys.readouterr().err
    assert not out.exists()


def test_substitution_compiles_and_is_recorded(tmp_path) -> None:
    out = tmp_path / "job"
    assert main(["compile", str(CISPO), "--target", "openrlhf", "-o", str(out),
                 "--substitute", "cispo=grpo"]) == 0
    readme = (out / "README.md").read_text()
    assert "--substitute cispo=grpo" in readme and "Substituted algorithm" in readme
    assert "substituted for cispo" in (out / "launch.sh").read_text()


@pytest.mark.parametrize("argv,message", [
    (["--target", "openrlhf"], "needs -o DIR"),
    (["--target", "openrlhf", "-o", "{tmp}/j", "--substitute", "cispo=magic"], "cannot run magic"),
    (["--target", "openrlhf", "-o", "{tmp}/j", "--substitute", "cispo"], "ALGORITHM=ALGORITHM"),
    (["--substitute", "cispo=grpo"], "only applies with --target"),
])
def test_command_line_errors(tmp_path, capsys, argv, message) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["compile", str(CISPO), *argv]) == 1  # usage errors exit 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_will_not_write_into_a_foreign_folder(tmp_path, capsys) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    spec = ROOT / "specs" / "askbench.ask"
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(tmp_path)]) == 1
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"
    job = tmp_path / "job"  # an earlier job is replaced, its checkpoints kept
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(job)]) == 0
    (job / "ckpt").mkdir()
    (job / "prompts.jsonl").write_text("stale")
    assert main(["compile", str(spec), "--target", "openrlhf", "-o", str(job)]) == 0
    assert (job / "ckpt").is_dir() and (job / "prompts.jsonl").read_text() != "stale"


def test_algorithm_table_is_the_mapping() -> None:
    from askspec.lang.blocks import ALGORITHMS as LANGUAGE
    from askspec.runtime.targets.openrlhf.mapping import ALGORITHMS, MISSING

    doc = (ROOT / "docs" / "cluster.md").read_text().split("## Algorithms")[1].split("\n## ")[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*) \|$", doc, re.M))
    assert set(rows) == LANGUAGE == set(ALGORITHMS) | set(MISSING)
    for name, (estimator, loss) in ALGORITHMS.items():
        assert f"--algo.advantage.estimator {estimator} --actor.policy_loss_type {loss}" in rows[name], name
    for name in MISSING:
        assert rows[name].startswith("refused (E601)"), name


def test_online_pasodoble_is_not_refused() -> None:
    """PasoDoble online (both roles updated every step, the solver's `sample 6 ask` inside
    the loop over the questions): one multi-policy job, no E602 or E603."""
    assert refusals(ROOT / "specs" / "pasodoble.ask", ROOT, profile="online") == ""
