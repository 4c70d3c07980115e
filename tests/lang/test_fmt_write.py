"""`askspec fmt` writes safely: a read-only file is refused with one error line (not an
internal error), a failed write leaves the original intact, symlinks and file modes are
kept."""

from __future__ import annotations

import argparse
import os
import stat

import pytest

from askspec import cli

from lang_helpers import run_cli

UGLY = "param   x=1\n"
PRETTY = "param x = 1\n"


def test_read_only_file_is_refused(tmp_path):
    spec = tmp_path / "ro.ask"
    spec.write_text(UGLY)
    spec.chmod(0o444)
    proc = run_cli("fmt", str(spec), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr == f"error: cannot write {spec}: permission denied (the file is read-only)\n"
    assert spec.read_text() == UGLY
    assert run_cli("fmt", "--check", str(spec), cwd=tmp_path).returncode == 1  # reading it is fine


def fmt(*files: str) -> int:
    return cli.cmd_fmt(argparse.Namespace(files=list(files), check=False))


def test_a_failed_write_keeps_the_original(tmp_path, monkeypatch, capsys):
    spec = tmp_path / "s.ask"
    spec.write_text(UGLY)

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("tempfile.mkstemp", full_disk)
    assert fmt(str(spec)) == 1
    assert "cannot write" in capsys.readouterr().err and spec.read_text() == UGLY
    assert [p.name for p in tmp_path.iterdir()] == ["s.ask"]  # no temporary file left behind


def test_mode_and_symlinks_are_kept(tmp_path):
    real = tmp_path / "real.ask"
    real.write_text(UGLY)
    real.chmod(0o640)
    link = tmp_path / "link.ask"
    link.symlink_to(real)
    assert fmt(str(link)) == 0
    assert link.is_symlink() and real.read_text() == PRETTY
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a file without write permission on its folder")
def test_read_only_folder(tmp_path):
    spec = tmp_path / "d" / "s.ask"
    spec.parent.mkdir()
    spec.write_text(UGLY)
    spec.parent.chmod(0o555)
    try:
        proc = run_cli("fmt", str(spec), cwd=tmp_path)
        assert proc.returncode == 1 and "cannot write" in proc.stderr and "internal" not in proc.stderr
        assert spec.read_text() == UGLY
    finally:
        spec.parent.chmod(0o755)
