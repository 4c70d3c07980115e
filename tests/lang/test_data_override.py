"""`--data NAME=FILE`: a data block read from the user's own file, checked record by record
against the block's declared fields (E111 at the block, naming the file, line and field),
part of the experiment hash, and what `askspec run` plays."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

import fake_models  # noqa: F401  (the spec's python model)

from askspec.diagnostics import format_diagnostic
from askspec.ir.canonical import experiment_hash
from askspec.lang import data_override
from askspec.lang.compiler import compile_file
from askspec.runtime.commands.run import run_spec
from askspec.runtime.store.views import open_store

SPEC = """model m = python("fake_models:echo_user")
role s { model = m; memory = none }
data problems = jsonl("shipped.jsonl") { fields = {id: string, question: string, answer: string} }
data passages = knowledge("shipped.jsonl")
game g for item in problems { x = ask s: item.question }
game k for item in passages { y = ask s: item.text }
"""


@pytest.fixture
def ask(tmp_path: Path) -> Path:
    (tmp_path / "shipped.jsonl").write_text(json.dumps({"id": "1", "question": "shipped?", "answer": "a", "text": "t"}) + "\n")
    path = tmp_path / "t.ask"
    path.write_text(SPEC)
    return path


def write(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def messages(res) -> list[str]:
    return [format_diagnostic(d, res.sources) for d in res.sink.sorted()]


def test_a_missing_field_names_the_file_line_and_field_at_the_block(ask, tmp_path):
    mine = write(tmp_path / "mine.jsonl", [{"id": "a", "question": "q", "answer": "1"}, {"id": "b", "question": "r"}])
    res = compile_file(str(ask), data={"problems": mine})
    assert not res.ok
    [text] = messages(res)
    assert f"t.ask:3:6: error[E111]: --data problems={mine}: {mine}:2: the record has no field 'answer'" in text
    assert "3 | data problems" in text and "^^^^^^^^" in text  # the caret under the block's name
    assert "declares id: string, question: string, answer: string" in text


def test_a_mistyped_field_and_a_knowledge_file_without_text(ask, tmp_path):
    mine = write(tmp_path / "mine.jsonl", [{"id": 7, "question": "q", "answer": "1"}])
    corpus = write(tmp_path / "corpus.jsonl", [{"id": "p1", "body": "a passage"}])
    res = compile_file(str(ask), data={"problems": mine, "passages": corpus})
    got = [d.message for d in res.sink.sorted()]
    assert got == [f"--data problems={mine}: {mine}:1: field 'id' is number, the block declares string",
                   f"--data passages={corpus}: {corpus}:1: the record has no field 'text'"]


def test_unknown_block_missing_not_regular_too_large_and_not_json(ask, tmp_path, monkeypatch):
    res = compile_file(str(ask), data={"problem": "x.jsonl"})
    [d] = res.sink.items
    assert d.code == "E111" and d.message == "--data problem: no data block named 'problem'" and "problems" in d.hint
    res = compile_file(str(ask), data={"problems": str(tmp_path / "nope.jsonl")})
    assert [d.message for d in res.sink.items] == [f"--data problems={tmp_path / 'nope.jsonl'}: no such file: "
                                                   f"{tmp_path / 'nope.jsonl'}"]
    res = compile_file(str(ask), data={"problems": str(tmp_path)})
    assert "is a folder, not a regular file" in res.sink.items[0].message
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        res = compile_file(str(ask), data={"problems": str(tmp_path / "fifo")})  # refused, not waited on
        assert "not a regular file" in res.sink.items[0].message
    big = write(tmp_path / "big.jsonl", [{"id": "a", "question": "q" * 100, "answer": "1"}])
    monkeypatch.setattr(data_override, "MAX_DATA_BYTES", 50)
    res = compile_file(str(ask), data={"problems": big})
    assert "refused" in res.sink.items[0].message and "limit" in res.sink.items[0].message
    monkeypatch.undo()
    (tmp_path / "bad.jsonl").write_text('{"id": "a"}\nnot json\n')
    res = compile_file(str(ask), data={"problems": str(tmp_path / "bad.jsonl")})
    assert res.sink.items[0].message.endswith("bad.jsonl:2: invalid JSON line (Expecting value); a data file has "
                                              "one JSON record a line")


def test_the_run_plays_the_users_records_and_the_hash_follows_the_file(ask, tmp_path):
    mine = write(tmp_path / "mine.jsonl", [{"id": "a", "question": "first of mine", "answer": "1"},
                                           {"id": "b", "question": "second of mine", "answer": "2"}])
    plain, over = compile_file(str(ask)), compile_file(str(ask), data={"problems": mine})
    assert over.ok and experiment_hash(plain.ir) != experiment_hash(over.ir)
    ds = next(d for d in over.ir.datasets if d.name == "problems")
    assert ds.user_file and ds.path == mine
    write(tmp_path / "mine.jsonl", [{"id": "a", "question": "changed", "answer": "1"}])
    assert experiment_hash(compile_file(str(ask), data={"problems": mine}).ir) != experiment_hash(over.ir)
    write(tmp_path / "mine.jsonl", [{"id": "a", "question": "first of mine", "answer": "1"},
                                    {"id": "b", "question": "second of mine", "answer": "2"}])
    rc, run_dir = asyncio.run(run_spec(str(ask), out=str(tmp_path / "runs"), data=[f"problems={mine}"]))
    assert rc == 0
    texts = [r[0] for r in open_store(run_dir).execute(
        "select text from turns join sessions using (session_id) where game = 'g' order by session_id").fetchall()]
    assert texts == ["first of mine", "second of mine"]
    manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    assert manifest["run_options"]["data"] == {"problems": mine}  # what a resume reads again


def test_a_resume_reads_the_files_the_run_recorded(tmp_path):
    from askspec.runtime.commands.options import RunOptions

    first = RunOptions.from_kwargs("t.ask", data=["problems=mine.jsonl"])
    saved = first.recorded()
    assert saved["data"] == {"problems": os.path.abspath("mine.jsonl")}
    again = RunOptions.from_kwargs(None, resume=str(tmp_path)).resumed(saved)
    assert again.data == {"problems": os.path.abspath("mine.jsonl")}
    assert RunOptions.from_kwargs(None, resume=str(tmp_path), data={"problems": "other.jsonl"}).resumed(saved).data == \
        {"problems": "other.jsonl"}  # given now: it wins (a changed file is then refused by the hash)


def test_estimate_counts_the_users_file(ask, tmp_path, capsys):
    """`askspec estimate --data` plans the sessions on the user's records, as the run would."""
    from askspec.cli import main

    mine = write(tmp_path / "mine.jsonl", [{"id": str(i), "question": f"q{i}", "answer": "a"} for i in range(7)])
    assert main(["estimate", str(ask), "--data", f"problems={mine}"]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:3] == ["eval", "g", "s"])
    assert row[3] == "7"  # the shipped file has one record
    assert main(["estimate", str(ask)]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:3] == ["eval", "g", "s"])
    assert row[3] == "1"
    assert main(["estimate", str(ask), "--data", "problems"]) == 1
    assert "--data takes NAME=FILE, got 'problems'" in capsys.readouterr().err
