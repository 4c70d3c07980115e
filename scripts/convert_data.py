"""Converts the public data formats the five papers used into the fields the specs'
data blocks declare, for `askspec run --data NAME=FILE` (docs/papers.md, "Reproduce the
papers' tables"). Nothing is downloaded: bring the files yourself, under their licences.

    python scripts/convert_data.py problems aime_2025.jsonl -o paper_data/aime_2025.jsonl --split test
    python scripts/convert_data.py medqa medqa_test.jsonl -o paper_data/medqa.jsonl --split train
    python scripts/convert_data.py passages megamath.parquet -o paper_data/passages.jsonl --limit 100000

Formats read (JSON lines, a JSON list, CSV or parquet; `--question-field` /
`--answer-field` name other columns):

- `problems`: a math benchmark, one problem a record, `{problem, answer}` or
  `{problem, solution}` (the answer is then the solution's last `\\boxed{}`), as MATH,
  MATH-500, AIME, HMMT and HARP are published; `question` is read for `problem` too,
  `final_answer` (OlympiadBench, a list of one) and `Short Answer` (IMO-AnswerBench's CSV)
  for `answer`, and a GSM8K answer's `#### N` is its N.
  Written as `{id, template, split, question, answer}` (Ask-E's downstream problems,
  Reasoning Arena's problems and held-out set, SOAR's hard set, PasoDoble's test set,
  AskBench's construction source); `template` is the source's name (`--source`, default
  the input file's name), `split` is `--split`, or with `--test-fraction F` a seeded
  share F of the records is `test` and the rest `train` (SOAR's 50-50 split, §4).
- `medqa`: MedQA's `{question, options: {A: ..., ...}, answer_idx}` (MedMCQA-style
  `answer` holding the option's text is matched to its letter), written in the same
  fields with the options listed under the question and the answer the option's letter.
- `passages`: a knowledge base, one passage a line of plain text, or records with a
  `text` field (MegaMath's parquet files): `{id, text}` for PasoDoble's `passages`.
  `--min-words` drops short passages; `--limit` keeps the first N.

Each output record is checked as it is written (a record without a question or an
answer stops the script, naming the input record), and the output is one JSON object a
line in UTF-8, as `--data` reads it."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any, Iterator

from askspec.lang.paths import MAX_DATA_BYTES, FileRefused, read_parquet_rows, read_regular
from askspec.runtime.replies.parsers import last_boxed


class ConvertError(ValueError):
    """A record that cannot be converted, or an input that cannot be read."""


def read_records(path: str) -> Iterator[tuple[int, Any]]:
    """(record number, record) of a JSON-lines, JSON-list or parquet file, read as every
    file askspec is handed is (a regular file, at most MAX_DATA_BYTES)."""
    try:
        data = read_regular(path, MAX_DATA_BYTES)
    except (FileRefused, OSError) as e:
        raise ConvertError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if path.lower().endswith(".parquet"):
        import io

        try:
            rows = read_parquet_rows(io.BytesIO(data), path, check_sizes=False)
        except ValueError as e:
            raise ConvertError(str(e)) from None
        yield from enumerate(rows, 1)
        return
    text = data.decode("utf-8-sig")
    if path.lower().endswith(".csv"):
        import csv
        import io

        yield from enumerate(csv.DictReader(io.StringIO(text)), 1)
        return
    if text.lstrip().startswith("["):
        yield from enumerate(json.loads(text), 1)
        return
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise ConvertError(f"{path}:{n}: not a JSON line ({e.msg})") from None


def _field(rec: Any, names: tuple[str, ...]) -> Any:
    if not isinstance(rec, dict):
        return None
    for name in names:
        if rec.get(name) not in (None, ""):
            return rec[name]
    return None


def _text(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:  # OlympiadBench's final_answer: a list of one
        value = value[0]
    return value.strip() if isinstance(value, str) else json.dumps(value) if value is not None else ""


def _final(answer: str) -> str:
    """GSM8K's answers are a worked solution ending in `#### N`: the N."""
    return answer.rsplit("####", 1)[1].strip() if "####" in answer else answer


def problem_record(rec: Any, n: int, source: str, question_field: str | None, answer_field: str | None) -> dict:
    """A benchmark problem as {id, template, split, question, answer} (split set later)."""
    question = _field(rec, (question_field,) if question_field else ("problem", "question", "Problem", "Question"))
    answer = _field(rec, (answer_field,) if answer_field else ("answer", "Answer", "final_answer", "short_answer",
                                                                 "Short Answer"))
    if answer is None and not answer_field:
        solution = _field(rec, ("solution", "Solution"))
        answer = last_boxed(solution) if isinstance(solution, str) else None
    if question is None or answer is None:
        what = "question" if question is None else "answer (no answer field and no \\boxed{} in a solution)"
        raise ConvertError(f"{source} record {n}: no {what}; name the field with --question-field / --answer-field")
    rid = _field(rec, ("id", "unique_id", "ID", "problem_id", "idx"))
    rid = f"{source}-{n}" if rid is None else str(rid) if str(rid).startswith(f"{source}-") else f"{source}-{rid}"
    return {"id": rid, "template": source, "split": "", "question": _text(question), "answer": _final(_text(answer))}


def medqa_record(rec: Any, n: int, source: str) -> dict:
    """A MedQA item: the stem, then its options one a line; the answer the option's letter."""
    options = rec.get("options") if isinstance(rec, dict) else None
    if not isinstance(options, dict) or not options or not isinstance(rec.get("question"), str):
        raise ConvertError(f"{source} record {n}: MedQA records have a question and options {{A: ..., B: ...}}")
    letter = rec.get("answer_idx")
    if letter not in options:  # MedMCQA-style: the answer is the option's text
        letter = next((k for k, v in options.items() if v == rec.get("answer")), None)
    if letter is None:
        raise ConvertError(f"{source} record {n}: answer_idx names no option ({sorted(options)})")
    listed = "\n".join(f"{k}. {_text(v)}" for k, v in sorted(options.items()))
    rid = _field(rec, ("id", "ID", "idx"))
    return {"id": f"{source}-{rid if rid is not None else n}", "template": source, "split": "",
            "question": f"{rec['question'].strip()}\n\n{listed}\n\nAnswer with the letter of the correct option.",
            "answer": str(letter)}


def passage_records(path: str, text_field: str, min_words: int) -> Iterator[dict]:
    """Passages as {id, text}: one a line of plain text, or records' `text_field`."""
    stem = Path(path).stem
    structured = path.lower().endswith((".parquet", ".json")) or _first_line_is_json(path)
    if structured:
        items = ((n, _field(rec, (text_field,))) for n, rec in read_records(path))
    else:
        lines = read_regular(path, MAX_DATA_BYTES).decode("utf-8-sig").splitlines()
        items = ((n, line) for n, line in enumerate(lines, 1))
    for n, text in items:
        text = _text(text)
        if text and len(text.split()) >= min_words:
            yield {"id": f"{stem}-{n}", "text": text}


def _first_line_is_json(path: str) -> bool:
    try:
        head = read_regular(path, MAX_DATA_BYTES)[:65536].decode("utf-8-sig", "replace").lstrip()
    except (FileRefused, OSError) as e:
        raise ConvertError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    return head.startswith("{")


def assign_splits(records: list[dict], split: str | None, test_fraction: float | None, seed: int) -> None:
    if test_fraction is None:
        for r in records:
            r["split"] = split or "test"
        return
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    test = set(order[: round(len(records) * test_fraction)])
    for i, r in enumerate(records):
        r["split"] = "test" if i in test else "train"


def write_jsonl(records: list[dict], out: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="kind", required=True)
    for kind, what in (("problems", "a math benchmark: {problem, answer} or {problem, solution}"),
                       ("medqa", "MedQA: {question, options, answer_idx}")):
        c = sub.add_parser(kind, help=what)
        c.add_argument("input")
        c.add_argument("-o", "--output", required=True)
        c.add_argument("--source", help="the records' `template` (default: the input file's name)")
        c.add_argument("--split", choices=["train", "test"], help="every record's split (default: test)")
        c.add_argument("--test-fraction", type=float, metavar="F",
                       help="a seeded share F of the records is `test`, the rest `train` (SOAR: 0.5)")
        c.add_argument("--seed", type=int, default=0)
        c.add_argument("--limit", type=int, help="keep the first N records")
        if kind == "problems":
            c.add_argument("--question-field", help="the question's field (default: problem, else question)")
            c.add_argument("--answer-field", help="the answer's field (default: answer, else a solution's \\boxed{})")
    c = sub.add_parser("passages", help="a knowledge base: text lines, or records with a text field")
    c.add_argument("input")
    c.add_argument("-o", "--output", required=True)
    c.add_argument("--text-field", default="text")
    c.add_argument("--min-words", type=int, default=1)
    c.add_argument("--limit", type=int)
    args = p.parse_args(argv)
    try:
        if args.kind == "passages":
            records = list(passage_records(args.input, args.text_field, args.min_words))
        else:
            if args.split and args.test_fraction is not None:
                p.error("give --split or --test-fraction, not both")
            if args.test_fraction is not None and not 0 <= args.test_fraction <= 1:
                p.error("--test-fraction is between 0 and 1")
            source = args.source or Path(args.input).stem
            records = [problem_record(rec, n, source, args.question_field, args.answer_field) if args.kind == "problems"
                       else medqa_record(rec, n, source) for n, rec in read_records(args.input)]
        if args.limit is not None:
            records = records[: args.limit]
        if not records:
            raise ConvertError(f"{args.input}: no records to write")
        if args.kind != "passages":
            assign_splits(records, args.split, args.test_fraction, args.seed)
        ids = [r["id"] for r in records]
        if len(set(ids)) != len(ids):
            raise ConvertError(f"{args.input}: records share an id; give each one an id field or none")
    except (ConvertError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_jsonl(records, args.output)
    print(f"{args.output}: {len(records)} record(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
