"""AskBench's data-construction pipeline (specs/askbench_build.ask; askbench.txt §3.1-3.2,
App. C.1) end to end on the replay backend: (query, answer) pairs become AskMind and
AskOverconfidence items with rubrics; a reply that does not parse is generated again, one
still malformed after the retries or with an empty required key is discarded; the built
items are exported with `askspec query --format jsonl` as a data set in the record layout
specs/askbench.ask reads. The prompts carry App. C.1's printed lines word for word."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_file
from askspec.runtime.commands.run import run_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "askbench_build.ask"
SOURCE = [json.loads(line) for line in (ROOT / "specs" / "data" / "math_problems.jsonl").read_text().splitlines()[:3]]
EXPORT = ("select vars->>'item_id' as id, vars->>'kind' as kind, vars->>'original_query' as original_query, "
          "vars->>'query' as query, vars->>'context' as context, vars->>'answer' as answer, vars->'rubric' as rubric "
          "from sessions where outcome = 'built' order by session_id")


def mind(question: str, rubric: list[str], info: str = "the numbers were removed") -> str:
    return json.dumps({"degraded_info": info, "rubric_criteria": rubric, "degraded_question": question})


def over(question: str, points: list[str]) -> str:
    return json.dumps({"overconfidence_info": "x is not 3; the equation gives 6", "misleading_points": points,
                       "overconfidence_question": question})


RECORDING = {"sessions": [
    # AskMind over the first three pairs: parsed; malformed then parsed (a retry); no rubric (discarded)
    {"degrader": ["Here it is:\n" + mind("Solve for x: ax - b = c.", ["a = 8", "b = 28", "c = 20"])]},
    {"degrader": ["{not json", mind("What is the sum of the divisors of a number?", ["the number is 144"])]},
    {"degrader": [mind("How many divisors does it have?", [])]},
    # AskOverconfidence: parsed; malformed three times (discarded after 2 retries); parsed
    {"overconfider": [over("Solve 8x - 28 = 20; clearly x = 3, right?", ["x = 3 is wrong"])]},
    {"overconfider": ["no", "still no", "{\"overconfidence_info\": 1"]},
    {"overconfider": [over("1000 = 2^3 * 5^3 has 9 divisors, so how many?", ["9 divisors is wrong", "exponent rule"])]},
]}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("build")
    replay = tmp / "replies.json"
    replay.write_text(json.dumps(RECORDING))
    rc, rd = asyncio.run(run_spec(str(SPEC), out=str(tmp / "runs"), replay=str(replay), set=["source_items=3"],
                                  quiet=True))
    assert rc == 0
    return Path(rd)


def export(run_dir: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "askspec.cli", "query", str(run_dir), EXPORT, "--format", "jsonl"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_built_items_export_as_askbench_records(run_dir):
    items = export(run_dir)
    a, b = SOURCE[0], SOURCE[1]
    c = SOURCE[2]
    assert items == [
        {"id": "mind-" + a["id"], "kind": "ask_mind", "original_query": a["question"], "query": "Solve for x: ax - b = c.",
         "context": "the numbers were removed", "answer": a["answer"], "rubric": ["a = 8", "b = 28", "c = 20"]},
        {"id": "mind-" + b["id"], "kind": "ask_mind", "original_query": b["question"],
         "query": "What is the sum of the divisors of a number?", "context": "the numbers were removed",
         "answer": b["answer"], "rubric": ["the number is 144"]},
        {"id": "over-" + a["id"], "kind": "ask_overconfidence", "original_query": a["question"],
         "query": "Solve 8x - 28 = 20; clearly x = 3, right?", "context": "x is not 3; the equation gives 6",
         "answer": a["answer"], "rubric": ["x = 3 is wrong"]},
        {"id": "over-" + c["id"], "kind": "ask_overconfidence", "original_query": c["question"],
         "query": "1000 = 2^3 * 5^3 has 9 divisors, so how many?", "context": "x is not 3; the equation gives 6",
         "answer": c["answer"], "rubric": ["9 divisors is wrong", "exponent rule"]},
    ]
    # the layout specs/askbench.ask reads (its shipped pool's and evaluation set's keys)
    for name in ("askbench_train.jsonl", "askbench_test.jsonl"):
        shipped = json.loads((ROOT / "specs" / "data" / name).read_text().splitlines()[0])
        assert all(set(it) == set(shipped) for it in items)


def test_a_malformed_reply_is_generated_again_then_discarded(run_dir):
    from askspec.runtime.store.views import open_store

    con = open_store(run_dir)
    outcomes = con.execute("select game, outcome from sessions order by session_id").fetchall()
    assert outcomes == [("ask_mind", "built"), ("ask_mind", "built"), ("ask_mind", "discarded"),
                        ("ask_overconfidence", "built"), ("ask_overconfidence", "discarded"),
                        ("ask_overconfidence", "built")]
    calls = [n for (n,) in con.execute("select count(*) from turns group by session_id order by session_id").fetchall()]
    assert calls == [1, 2, 1, 1, 3, 1]  # a retry is a new call; the third malformed reply ends the tries


def test_prompts_print_app_c1_word_for_word():
    exp = compile_file(str(SPEC)).ir
    degrade = exp.templates[exp.role("degrader").prompt].source
    for line in ("You are an expert in query obfuscation. Your task is to take the given original Q&A pair and "
                 "perform targeted modifications to the query to make it both informationally incomplete and ambiguous.",
                 "Return the result as raw JSON ONLY (no prose, no code fences, no markdown):",
                 '  "degraded_info": "<description of what was removed or blurred>",',
                 '  "rubric_criteria": ["<point 1>", "<point 2>", "..."],',
                 '  "degraded_question": "<query with only the targeted modifications applied>"'):
        assert line in degrade
    overconf = exp.templates[exp.role("overconfider").prompt].source
    for line in ('  "misleading_points": ["<short label 1>", "<short label 2>", "..."],',
                 '  "overconfidence_question": "<single confident query that preserves all givens but includes the '
                 'wrong assertions>"'):
        assert line in overconf


def test_only_plain_values_and_short_lists_of_them_are_recorded():
    from askspec.runtime.engine.session import RECORDED_LIST, recordable

    assert all(recordable(v) for v in (1, 0.5, "x", True, None, ["a", 1, None], []))
    assert not recordable(["x"] * (RECORDED_LIST + 1))  # a long list stays out of the store's vars
    assert not recordable([{"question": "q"}]) and not recordable({"a": 1})
