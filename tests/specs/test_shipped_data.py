"""The data shipped in specs/data/ (issue 15, item 7): the generator reproduces every file
byte for byte from its seed, every answer is checked with math-verify against an
independent brute-force computation, the hard set has a held-out test split, and no file
is large."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from math_verify import parse, verify

from askspec.runtime.replies.verify import equiv

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "specs" / "data"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_data", ROOT / "scripts" / "gen_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_generator_reproduces_the_shipped_files(gen):
    for name, text in gen.build(gen.SEED).items():
        assert (DATA / name).read_text(encoding="utf-8") == text, f"{name}: rerun scripts/gen_data.py"


def test_another_seed_gives_other_problems(gen):
    assert gen.build(1)[gen.MATH_FILE] != gen.build(0)[gen.MATH_FILE]


@pytest.mark.parametrize("name", ["math_problems.jsonl", "soar_hard.jsonl"])
def test_every_answer_verifies_against_the_brute_force_one(gen, name):
    rows = gen.generate(gen.SEED)[name]
    assert len(rows) >= 100 and len({r["question"] for r in rows}) == len(rows)
    for r in rows:
        gold, brute = parse(f"${r['answer']}$"), parse(f"${r['_brute']}$")
        assert gold and brute, r
        assert verify(gold, brute), r  # math-verify itself
        assert equiv(r["answer"], r["_brute"]), r  # and the specs' equiv
        assert not verify(gold, parse(f"${r['_brute']} + 1$")), r  # a wrong answer is told apart


def test_sizes_splits_and_passages():
    math_rows = [json.loads(line) for line in (DATA / "math_problems.jsonl").read_text().splitlines()]
    hard = [json.loads(line) for line in (DATA / "soar_hard.jsonl").read_text().splitlines()]
    passages = [json.loads(line) for line in (DATA / "passages.jsonl").read_text().splitlines()]
    assert len(math_rows) == 300 and len(hard) == 120
    splits = [h["split"] for h in hard]
    assert splits.count("test") == 30 and splits.count("train") == 90
    # the math problems' held-out split (the evaluation stages' data): the last 60, every template
    # but the word arrangements (whose 8 distinct problems are drawn early)
    assert [r["split"] for r in math_rows] == ["train"] * 240 + ["test"] * 60
    assert {r["template"] for r in math_rows[240:]} == {r["template"] for r in math_rows} - {"t_word"}
    assert len(passages) >= 40 and all(20 <= len(p["text"].split()) <= 80 for p in passages)
    for f in DATA.iterdir():
        assert f.stat().st_size < 256 * 1024, f
    assert (DATA / "README.md").exists()


def test_the_pasodoble_cold_start_records_parse_in_each_role_s_format_with_verified_answers(gen):
    """App. A cold start: each completion parses with its role's reply parser in
    specs/pasodoble.ask, its answer verifies against the brute-force one (math-verify and
    `equiv`), the proposer's prompt is its passage's, and no question is one of the
    held-out evaluation problems."""
    from askspec.lang.compiler import compile_file
    from askspec.runtime.engine.calls import parse_reply

    exp = compile_file(str(ROOT / "specs" / "pasodoble.ask"), {}).ir
    rows = gen.generate(gen.SEED)
    held_out = {r["question"] for r in rows["math_problems.jsonl"]}
    passages = {p["id"]: p["text"] for p in rows["passages.jsonl"]}
    questions = []
    for role in ("proposer", "solver"):
        records = rows[f"pasodoble_cold_{role}.jsonl"]
        assert len(records) == 150 and len({r["id"] for r in records}) == 150
        assert len({r["template"] for r in records}) == 12  # every topic template
        for r in records:
            reply = parse_reply(exp.role(role).reply, r["completion"], "stop")
            assert reply["ok"], r
            got = reply["fields"]["answer"]
            assert verify(parse(f"${r['_brute']}$"), parse(f"${got}$")), r
            assert equiv(got, r["_brute"]) and equiv(got, r["answer"]), r
            assert not equiv(got, f"{r['_brute']} + 1"), r
            if role == "proposer":
                assert reply["fields"]["problem"] == r["_question"]
                assert r["prompt"].startswith(f"External knowledge: {passages[r['passage']]}\n"), r
            else:
                assert r["prompt"] == r["_question"]
            questions.append(r["_question"])
    assert len(set(questions)) == len(questions) and not set(questions) & held_out
