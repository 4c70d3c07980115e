"""Parquet data files are read on the calling thread (askspec.lang.paths.read_parquet_rows): Arrow's
dataset reader starts native thread pools that can abort a process at exit after its
work is done (CI saw `convert_data.py` exit -6 that way). The property is checked
directly: reading starts no thread, in the run's loader, `--data` and the converter."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.lang.data_override import read_data_file
from askspec.lang.paths import MAX_RECORD_BYTES, read_parquet_rows

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")

COUNT_THREADS = """
import io, os, sys
import pyarrow.parquet
def threads(): return len(os.listdir("/proc/self/task"))
before = threads()
{read}
print(before, threads())
"""


def write_parquet(path: Path, rows: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(rows), path)


@pytest.mark.parametrize("read", [
    "from askspec.lang.paths import read_parquet_rows; read_parquet_rows(open(sys.argv[1], 'rb'), 'x')",
    "from askspec.lang.data_override import read_data_file; assert not read_data_file(sys.argv[1], 'jsonl', None).unreadable",
    "from askspec.ir import model as ir; from askspec.runtime.engine.plan import load_dataset;"
    " assert len(load_dataset(ir.Dataset(name='d', format='parquet', path=sys.argv[1]), '/', 0)) == 3",
])
def test_reading_starts_no_thread(tmp_path, read):
    write_parquet(tmp_path / "d.parquet", {"text": ["a b", "c d", "e"], "n": [1, 2, 3]})
    proc = subprocess.run([sys.executable, "-c", COUNT_THREADS.format(read=read), str(tmp_path / "d.parquet")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    before, after = map(int, proc.stdout.split())
    assert after == before


def test_the_converter_starts_no_thread(tmp_path):
    """convert_data.py's parquet path, in its own process, as a user runs it."""
    write_parquet(tmp_path / "m.parquet", {"text": ["one two three", "four five"], "url": ["a", "b"]})
    script = Path(__file__).resolve().parents[2] / "scripts" / "convert_data.py"
    code = ("import sys, os; sys.argv = ['convert_data.py', 'passages', 'm.parquet', '-o', 'p.jsonl'];"
            "import pyarrow.parquet, importlib.util as u; before = len(os.listdir('/proc/self/task'));"
            f"spec = u.spec_from_file_location('cd', {str(script)!r}); m = u.module_from_spec(spec); spec.loader.exec_module(m);"
            "assert m.main(sys.argv[1:]) == 0; print(before, len(os.listdir('/proc/self/task')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    before, after = map(int, proc.stdout.split())
    assert after == before
    assert [json.loads(line)["text"] for line in (tmp_path / "p.jsonl").read_text().splitlines()] == \
        ["one two three", "four five"]


def test_not_parquet_and_too_large_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"^junk.parquet: not a parquet file"):
        read_parquet_rows(io.BytesIO(b"not parquet at all"), "junk.parquet")
    write_parquet(tmp_path / "big.parquet", {"prompt": ["a", "x" * (MAX_RECORD_BYTES + 1)]})
    got = read_data_file(str(tmp_path / "big.parquet"), "jsonl", None)
    assert got.format == "parquet"
    assert len(got.unreadable) == 1 and "row 2, field 'prompt': a record of 1,048,577 bytes" in got.unreadable[0]
    # the converter reads the long row (it writes JSON lines that the check then measures)
    rows = read_parquet_rows(open(tmp_path / "big.parquet", "rb"), "big.parquet", check_sizes=False)
    assert len(rows[1]["prompt"]) == MAX_RECORD_BYTES + 1
