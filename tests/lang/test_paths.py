"""A spec reads only regular files inside its own folder tree (E304): no absolute paths
out, no `..` out, no symlinks out, no devices or FIFOs, nothing over the size limits;
`run` refuses such a spec with the diagnostic, and loading data at run time makes the
same checks again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from askspec.ir import model as ir
from askspec.lang import paths
from askspec.lang.compiler import compile_file
from askspec.runtime.engine.plan import load_dataset

from lang_helpers import ROOT, run_cli

SECRET = "root:hunter2-do-not-send"


@pytest.fixture
def tree(tmp_path):
    """tmp/outside/secret.txt (a file outside), tmp/spec/ (the spec's folder)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "secret.jsonl").write_text('{"question": "%s"}\n' % SECRET)
    spec = tmp_path / "spec"
    (spec / "prompts").mkdir(parents=True)
    (spec / "data").mkdir()
    (spec / "prompts" / "ok.j2").write_text("Hello {{ role }}\n")
    (spec / "data" / "ok.jsonl").write_text('{"question": "1 + 1"}\n')
    return tmp_path


def write_spec(spec_dir: Path, *, template: str = '"Hi"', data: str = '"data/ok.jsonl"', fmt: str = "jsonl",
               extra: str = "") -> Path:
    path = spec_dir / "t.ask"
    path.write_text(
        f'model m = hf("smollm2-135m-instruct")\n'
        f'role q {{ model = m; prompt = {template} }}\n'
        f'param dpath = {data}\n'
        f'data items = {fmt}(dpath)\n'
        f'{extra}'
        f'game g for it in items {{\n    ask q\n}}\n'
    )
    return path


def codes(res) -> list[str]:
    return [d.code for d in res.sink.sorted()]


def assert_refused(res, needle: str) -> None:
    errors = [d for d in res.sink.sorted() if d.is_error]
    assert res.ir is None
    assert [d.code for d in errors] == ["E304"], [(d.code, d.message) for d in errors]
    assert needle in errors[0].message
    assert errors[0].span is not None and errors[0].span.line > 0
    # nothing of the file was read into the result
    assert all(SECRET not in text for text in res.files.values())


@pytest.mark.parametrize("template, needle", [
    ('file("{outside}/secret.txt")', "outside the spec's folder"),
    ('file("../outside/secret.txt")', "outside the spec's folder"),
    ('file("prompts/../../outside/secret.txt")', "outside the spec's folder"),
    ('file("/etc/passwd")', "outside the spec's folder"),
    ('file("prompts/link.j2")', "through a symlink"),
    ('file("prompts/dirlink/secret.txt")', "through a symlink"),
    ('file("/dev/zero")', "outside the spec's folder"),
    ('file("prompts/zero.j2")', "through a symlink"),
    ('file("prompts")', "a folder"),
    ('file("prompts/fifo.j2")', "FIFO"),
    ('file("prompts/big.j2")', "the limit is 1 MiB"),
])
def test_template_files_are_confined(tree, template, needle):
    spec = tree / "spec"
    (spec / "prompts" / "link.j2").symlink_to(tree / "outside" / "secret.txt")
    (spec / "prompts" / "dirlink").symlink_to(tree / "outside", target_is_directory=True)
    (spec / "prompts" / "zero.j2").symlink_to("/dev/zero")
    os.mkfifo(spec / "prompts" / "fifo.j2")  # no writer: opening it blocking would hang
    (spec / "prompts" / "big.j2").write_bytes(b"a" * (paths.MAX_TEMPLATE_BYTES + 1))
    res = compile_file(str(write_spec(spec, template=template.format(outside=tree / "outside"))))
    assert_refused(res, needle)


@pytest.mark.parametrize("data, fmt, needle", [
    ('"{outside}/secret.jsonl"', "jsonl", "outside the spec's folder"),
    ('"../outside/secret.jsonl"', "jsonl", "outside the spec's folder"),
    ('"data/link.jsonl"', "knowledge", "through a symlink"),
    ('"/dev/zero"', "parquet", "outside the spec's folder"),
    ('"data/fifo.jsonl"', "jsonl", "FIFO"),
    ('"data"', "jsonl", "a folder"),
])
def test_data_files_are_confined(tree, data, fmt, needle):
    spec = tree / "spec"
    (spec / "data" / "link.jsonl").symlink_to(tree / "outside" / "secret.jsonl")
    os.mkfifo(spec / "data" / "fifo.jsonl")
    res = compile_file(str(write_spec(spec, data=data.format(outside=tree / "outside"), fmt=fmt)))
    assert_refused(res, needle)


def test_data_path_from_an_override_is_confined(tree):
    path = write_spec(tree / "spec")
    assert compile_file(str(path)).ok
    res = compile_file(str(path), {"dpath": str(tree / "outside" / "secret.jsonl")})
    assert_refused(res, "outside the spec's folder")


def test_data_size_limit(tree, monkeypatch):
    monkeypatch.setattr("askspec.lang.blocks.MAX_DATA_BYTES", 10)
    res = compile_file(str(write_spec(tree / "spec")))
    assert_refused(res, "the limit is 10 bytes")


def test_paths_inside_the_folder_still_work(tree):
    spec = tree / "spec"
    (spec / "prompts" / "inner.j2").symlink_to("ok.j2")  # a symlink that stays inside
    for template in ('file("prompts/ok.j2")', 'file("prompts/inner.j2")', 'file("prompts/../prompts/ok.j2")',
                     f'file("{spec}/prompts/ok.j2")', 'file("./prompts/ok.j2")'):
        res = compile_file(str(write_spec(spec, template=template)))
        assert res.ok, [(d.code, d.message) for d in res.sink.sorted()]
        # recorded with a clean relative path (a run stores it under spec/)
        assert set(res.files) <= {"t.ask", "prompts/ok.j2", "prompts/inner.j2"}, res.files


def test_a_spec_in_a_symlinked_folder(tree):
    """The folder tree is the spec's real folder: a link to it is not 'outside'."""
    write_spec(tree / "spec", template='file("prompts/ok.j2")')
    link = tree / "link"
    link.symlink_to(tree / "spec", target_is_directory=True)
    assert compile_file(str(link / "t.ask")).ok


def test_check_on_a_fifo_template_does_not_block(tree):
    spec = tree / "spec"
    os.mkfifo(spec / "prompts" / "fifo.j2")
    path = write_spec(spec, template='file("prompts/fifo.j2")')
    proc = run_cli("check", str(path), timeout=60)
    assert proc.returncode == 1 and "E304" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ["fifo.ask", "/dev/zero", "folder"])
def test_the_spec_itself_must_be_a_regular_file(tmp_path, name):
    os.mkfifo(tmp_path / "fifo.ask")
    (tmp_path / "folder").mkdir()
    for cmd in ("check", "compile", "fmt"):
        proc = run_cli(cmd, name, cwd=tmp_path, timeout=60)
        assert proc.returncode == 1, (cmd, proc.stderr)
        assert "not a regular file" in proc.stderr and "internal error" not in proc.stderr


def test_run_refuses_with_the_diagnostic(tree, tmp_path):
    path = write_spec(tree / "spec", template='file("../outside/secret.txt")')
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "run", str(path), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "error[E304]" in proc.stderr and "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert SECRET not in proc.stderr + proc.stdout
    assert not out.exists()


def test_run_time_loading_checks_again(tree):
    """A data file swapped for a symlink out of the folder after `check` is refused when
    the run loads it."""
    spec = tree / "spec"
    ds = ir.Dataset(name="items", format="jsonl", path="data/ok.jsonl", items=None, options={})
    assert load_dataset(ds, str(spec), 0) == [{"question": "1 + 1"}]
    (spec / "data" / "ok.jsonl").unlink()
    (spec / "data" / "ok.jsonl").symlink_to(tree / "outside" / "secret.jsonl")
    with pytest.raises(paths.FileRefused, match="through a symlink"):
        load_dataset(ds, str(spec), 0)
    (spec / "data" / "ok.jsonl").unlink()
    os.mkfifo(spec / "data" / "ok.jsonl")
    with pytest.raises(ValueError, match="FIFO"):
        load_dataset(ds, str(spec), 0)
