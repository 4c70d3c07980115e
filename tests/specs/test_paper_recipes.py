"""docs/papers.md "Reproduce the papers' tables": each paper's recipe, its commands as the
page writes them, on a few records of each public format written here (the benchmarks
are not shipped). The fast test converts the records, checks every `askspec run` with
its --profile / --set / --data (`askspec check`), compiles the OpenRLHF jobs and builds
AskBench's items on recorded replies; the slow one also plays every `--eval-only` run on
the embedded SmolLM2-135M at tiny budgets. A `--model ROLE=hf:FOLDER` whose folder is
not there, and a served model (`openai:`, `--base-url`), are left out: the embedded model
plays the role. The `askspec` commands run in the test's process (askspec.cli.main, as
other tests call it), the others (the converter, `cat`) as subprocesses."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "papers.md"
PAPERS = ["Ask-E", "AskBench", "PasoDoble", "SOAR", "Reasoning Arena"]


def recipes() -> dict[str, list[str]]:
    """Paper -> the commands of its recipe's bash blocks (continuation lines joined, comments
    left out), from the page's "Reproduce the papers' tables" section."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Reproduce the papers' tables\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for part in section.split("\n### ")[1:]:
        title = part.split(":", 1)[0].strip()
        lines = []
        for block in re.findall(r"```bash\n(.*?)```", part, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    lines.append(line.strip())
        out[title] = lines
    return out


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# The public formats, a few records each (answers a 135M model does not write in 8 tokens,
# so SOAR's fail@k filter keeps them).
MATH = [{"problem": "Find the number of positive divisors of $7!$.", "solution": "$7! = 2^4 3^2 5 \\cdot 7$, so "
         "$5 \\cdot 3 \\cdot 2 \\cdot 2 = \\boxed{60}$.", "answer": "60", "subject": "Number Theory", "level": 3,
         "unique_id": "test/number_theory/1.json"},
        {"problem": "What is $\\frac{91}{3} + \\frac{2}{9}$?", "solution": "$\\frac{273 + 2}{9} = \\boxed{\\frac{275}{9}}$.",
         "answer": "\\frac{275}{9}", "subject": "Prealgebra", "level": 2, "unique_id": "test/prealgebra/2.json"}]
AIME = [{"id": 61, "problem": "Find the remainder when $3^{2024}$ is divided by $1000$.", "solution": "... so "
         "the remainder is $\\boxed{281}$.", "answer": 281},
        {"id": 62, "problem": "How many ordered pairs $(a, b)$ of positive integers satisfy $ab = 7200$?",
         "solution": "$7200 = 2^5 3^2 5^2$: $6 \\cdot 3 \\cdot 3 = 54$.", "answer": 54}]
RECORDS = {
    "aime_2024.jsonl": jsonl(AIME),
    "aime_2025.jsonl": jsonl([{"problem": r["problem"], "answer": str(r["answer"])} for r in AIME]),
    "math500.jsonl": jsonl(MATH),
    "math_test.jsonl": jsonl([{k: v for k, v in r.items() if k != "answer"} for r in MATH]
                             + [{"problem": "Compute $\\sum_{k=1}^{40} k^3$.", "solution": "$\\boxed{672400}$",
                                 "level": 5, "type": "Algebra"},
                                {"problem": "Find $\\gcd(8128, 496 \\cdot 17)$.", "solution": "$\\boxed{8432}$",
                                 "level": 5, "type": "Number Theory"}]),
    "medqa_test.jsonl": jsonl([
        {"question": "A 34-year-old woman has fatigue and a low ferritin. Which is the most likely cause?",
         "answer": "Iron deficiency", "options": {"A": "Iron deficiency", "B": "Thalassemia", "C": "B12 deficiency",
                                                  "D": "Hemolysis"}, "meta_info": "step1", "answer_idx": "A"},
        {"question": "Which drug reverses heparin?", "answer": "Protamine sulfate",
         "options": {"A": "Vitamin K", "B": "Protamine sulfate", "C": "Idarucizumab", "D": "Andexanet"},
         "meta_info": "step2&3", "answer_idx": "B"}]),
    "dapo_math_17k.jsonl": jsonl([{"prompt": "Find the sum of all primes below 30.", "solution": "129",
                                   "data_source": "math_dapo"},
                                  {"prompt": "How many subsets of {1, ..., 10} have exactly 3 elements?",
                                   "solution": "120", "data_source": "math_dapo"}]),
    "gsm8k_test.jsonl": jsonl([{"question": "Ann has 3 boxes of 17 pens and gives away 9. How many are left?",
                                "answer": "3 * 17 = 51 pens; 51 - 9 = 42.\n#### 42"}]),
}
PASSAGES = ["The sum of the first n odd numbers is n squared: 1 + 3 + 5 + 7 = 16 = 4 squared, as a picture of "
            "nested squares shows.",
            "A number's divisor count is the product of its prime exponents plus one: 72 = 2^3 3^2 has 4 times 3, "
            "twelve divisors in all."]


def _build_replies() -> str:
    """Recorded construction replies for specs/askbench_build.ask: every session has both
    roles' reply, so the recording serves any `source_items` (session k of the run reads
    `sessions[k]`, whichever dimension's game it plays; 2 items a dimension at most)."""
    mind = json.dumps({"degraded_info": "the numbers were removed", "rubric_criteria": ["the number is given"],
                       "degraded_question": "How many divisors does the number have?"})
    over = json.dumps({"overconfidence_info": "the claim 7! = 720 is wrong", "misleading_points": ["7! is not 720"],
                       "overconfidence_question": "Since 7! = 720, how many divisors does it have?"})
    return json.dumps({"sessions": [{"degrader": [mind], "overconfider": [over]}] * 4})


# tiny budgets for a played evaluation, per spec (after the recipe's own --set values: later wins).
# AskBench's evaluations are its cost (each session's judge prompt is ~550 tokens, prefilled
# on the CPU, and --stage plays every item, so --sessions cannot cap them): the slow mode
# builds one item a dimension per source, so each evaluation plays 4 items (both
# dimensions, both domains) rather than 8.
TINY = {"askbench_build": ["--set", "source_items=1"],
        "ask_e": ["--set", "downstream_items=1", "--set", "downstream_samples=1"],
        "askbench": ["--set", "turns=2", "--set", "judge_retries=0", "--set", "eval_dimensions=[\"ask_mind\"]"],
        "pasodoble": ["--set", "eval_items=1", "--set", "eval_samples=1", "--set", "eval_tokens=8"],
        "soar": ["--set", "eval_samples=2", "--set", "pass_k=[2]"],
        "reasoning_arena": ["--set", "eval_items=1", "--set", "eval_samples=5"]}
CHECK_FLAGS = {"--profile", "--set", "--data"}  # what `askspec check` takes of a run's flags


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A folder laid out as the recipes expect: specs/ and scripts/ of this checkout,
    downloads/ with the records above."""
    (tmp_path / "specs").symlink_to(ROOT / "specs")
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    down = tmp_path / "downloads"
    down.mkdir()
    for name, text in RECORDS.items():
        (down / name).write_text(text, encoding="utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": PASSAGES, "url": ["a", "b"]}), down / "megamath_pro_max.parquet")
    (tmp_path / "build_replies.json").write_text(_build_replies())
    return tmp_path


def _wrong_answers(spec: Path) -> str:
    """A recording in which every role of `spec` answers every call with a wrong answer."""
    from askspec.lang.compiler import compile_file

    roles = [r.name for r in compile_file(str(spec)).ir.roles]
    return json.dumps({"sessions": [{r: ["\\boxed{0}"] * 4 for r in roles}] * 64})


def _without_models(argv: list[str], cwd: Path) -> list[str]:
    """A run's flags less served models and weights folders that are not there."""
    out, i = [], 0
    while i < len(argv):
        flag = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if flag == "--base-url" or (flag == "--model" and (value.split("=", 1)[-1].startswith("openai:") or (
                value.split("=", 1)[-1].startswith("hf:") and not (cwd / value.split(":", 1)[1]).is_dir()))):
            i += 2
            continue
        out.append(flag)
        i += 1
    return out


def _check_of(argv: list[str]) -> list[str]:
    """`askspec run SPEC FLAGS` as `askspec check SPEC` with the flags check takes."""
    out = ["askspec", "check", argv[2]]
    i = 3
    while i < len(argv):
        if argv[i] in CHECK_FLAGS:
            out += argv[i:i + 2]
            i += 2
        elif argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            i += 2  # a run's flag and its value
        else:
            i += 1
    return out


def _askspec_here(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`askspec ARGS` in this process, in `cwd`: what the command runs (askspec.cli.main)
    without a new interpreter importing torch and transformers for each run (~5 s of CPU a
    run, most of a tiny evaluation's cost). What a run sets for the rest of its process (the
    libraries' quiet: environment, loggers, warning filters) is put back after it; the
    libraries' progress bars stay off (read once, when they load)."""
    from askspec.cli import main
    from askspec.runtime.commands.noise import LIBRARY_LOGGERS

    env = dict(os.environ)
    levels = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    out, err = io.StringIO(), io.StringIO()
    try:
        with (contextlib.chdir(cwd), warnings.catch_warnings(), contextlib.redirect_stdout(out),
              contextlib.redirect_stderr(err)):
            os.environ.pop("ASKSPEC_DEBUG", None)
            rc = main(args)
    finally:
        os.environ.clear()
        os.environ.update(env)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def play(paper: str, cwd: Path, slow: bool) -> list[tuple[str, str]]:
    """Runs the recipe's commands in `cwd`; returns (what ran, its kind) pairs."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("ASKSPEC_DEBUG", None)
    last_run: str | None = None
    done = []
    lines = recipes()[paper]
    for n, line in enumerate(lines):
        argv = shlex.split(line)
        queried = n + 1 < len(lines) and "askspec query runs/<run>" in lines[n + 1]
        target = None
        if ">" in argv:
            argv, target = argv[: argv.index(">")], argv[argv.index(">") + 1]
        kind = argv[0] if argv[0] != "askspec" else f"askspec {argv[1]}"
        if any("runs/<run>" in a for a in argv):
            if last_run is None:
                continue  # a query of an evaluation this mode checked instead of playing
            argv = [a.replace("runs/<run>", last_run) for a in argv]
        if kind == "askspec metrics" and not slow:
            continue
        if kind == "askspec run":
            spec = Path(argv[2]).stem
            if spec == "askbench_build":  # the construction model's replies, recorded
                argv = argv + ["--replay", "build_replies.json", "--quiet"] + (TINY[spec] if slow else [])
            elif slow and "--eval-only" in argv:
                argv = _without_models(argv, cwd) + TINY[spec] + ["--max-tokens", "8", "--quiet"]
            elif "--eval-only" in argv and queried:  # its sessions feed a query: played, on recorded wrong answers
                (cwd / "wrong_answers.json").write_text(_wrong_answers(ROOT / argv[2]))
                argv = _without_models(argv, cwd) + TINY[spec] + ["--replay", "wrong_answers.json", "--quiet"]
            else:
                argv, kind = _check_of(argv), "askspec check"
        if argv[0] == "askspec":  # in this process: one import of askspec and the model's libraries
            shell = shlex.join(argv) + (f" > {shlex.quote(target)}" if target else "")
            proc = _askspec_here(argv[1:], cwd)
            if target and proc.returncode == 0:
                (cwd / target).write_text(proc.stdout, encoding="utf-8")
        else:
            if argv[0] == "python":
                argv = [sys.executable, *argv[1:]]
            shell = shlex.join(argv) + (f" > {shlex.quote(target)}" if target else "")
            proc = subprocess.run(["bash", "-c", shell], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=900)
        assert proc.returncode == 0, f"{paper}: {line}\n-> {shell}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        if kind == "askspec run":
            last_run = proc.stdout.strip().splitlines()[-1]
            _assert_played(cwd / last_run, line)
        done.append((line, kind))
    return done


def _assert_played(run_dir: Path, line: str) -> None:
    """Every session of a played run ended ok, and the data it read is the converted file's."""
    from askspec.runtime.store.views import open_store

    con = open_store(str(run_dir))
    rows = con.execute("select status, error, params from sessions").fetchall()
    assert rows, f"no sessions: {line}"
    assert all(r[0] == "ok" for r in rows), (line, [r for r in rows if r[0] != "ok"][:2])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    data = (manifest.get("run_options") or {}).get("data") or {}
    for name, path in data.items():
        assert "paper_data" in path, (name, path)


@pytest.mark.parametrize("paper", PAPERS)
def test_recipe_converts_checks_and_plans(paper, workdir):
    done = play(paper, workdir, slow=False)
    kinds = [k for _, k in done]
    assert "python" in kinds, "the recipe converts its data"
    assert any(k == "askspec check" and "--data" in line for line, k in done), "a run is checked on the converted data"
    for f in (workdir / "paper_data").glob("*.jsonl"):
        assert f.read_text(encoding="utf-8").strip(), f"{f.name} is empty"


@pytest.mark.slow
@pytest.mark.parametrize("paper", PAPERS)
def test_recipe_plays_its_evaluations_on_the_embedded_model(paper, workdir):
    done = play(paper, workdir, slow=True)
    assert any(k == "askspec run" and "--eval-only" in line for line, k in done), "an evaluation is played"


def test_recipes_cover_every_paper_and_name_their_rows():
    text = DOC.read_text(encoding="utf-8").split("\n## Reproduce the papers' tables\n", 1)[1]
    assert sorted(recipes()) == sorted(PAPERS)
    for part in text.split("\n### ")[1:]:
        for field in ("**Data**", "**Models**", "**Hardware, time**", "**Rows**"):
            assert field in part, (part.split("\n", 1)[0], field)


def test_converter_reports_a_record_without_an_answer(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text(jsonl([{"problem": "1 + 1?", "solution": "two, with no box"}]))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_data.py"), "problems", str(src),
                           "-o", str(tmp_path / "out.jsonl")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "bad record 1: no answer" in proc.stderr, proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_converters_write_the_specs_fields(workdir):
    """Each format's records land in the fields the specs declare (values checked)."""
    conv = [sys.executable, "scripts/convert_data.py"]
    runs = [["problems", "downloads/math500.jsonl", "-o", "o/math.jsonl", "--test-fraction", "0.5"],
            ["problems", "downloads/gsm8k_test.jsonl", "-o", "o/gsm8k.jsonl"],
            ["medqa", "downloads/medqa_test.jsonl", "-o", "o/medqa.jsonl", "--split", "train"],
            ["passages", "downloads/megamath_pro_max.parquet", "-o", "o/passages.jsonl"]]
    for args in runs:
        proc = subprocess.run(conv + args, cwd=workdir, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    read = lambda name: [json.loads(x) for x in (workdir / "o" / name).read_text().splitlines()]  # noqa: E731
    math = read("math.jsonl")
    assert [(r["id"], r["answer"]) for r in math] == [("math500-test/number_theory/1.json", "60"),
                                                      ("math500-test/prealgebra/2.json", "\\frac{275}{9}")]
    assert sorted(r["split"] for r in math) == ["test", "train"] and {r["template"] for r in math} == {"math500"}
    assert read("gsm8k.jsonl")[0]["answer"] == "42"
    med = read("medqa.jsonl")[1]
    assert med["answer"] == "B" and "B. Protamine sulfate" in med["question"] and med["split"] == "train"
    assert [r["text"] for r in read("passages.jsonl")] == PASSAGES
    assert set(read("math.jsonl")[0]) == {"id", "template", "split", "question", "answer"}
