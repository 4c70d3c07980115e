"""scripts/setup.sh installs with uv, told pip's own package sources by
scripts/pip_sources.py: the same wheel folders, indexes and constraints, with pip's
choice among them (the best version anywhere), so uv installs what pip would."""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("pip_sources", ROOT / "scripts" / "pip_sources.py")
assert spec is not None and spec.loader is not None
pip_sources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pip_sources)


def test_pips_sources_become_uvs_arguments(tmp_path):
    wheels, index, constraints = tmp_path / "wheels", tmp_path / "simple", tmp_path / "constraints.txt"
    wheels.mkdir()
    index.mkdir()
    constraints.write_text("torch<=2.14.1\n")
    args = pip_sources.uv_args({
        "find-links": [str(wheels)],
        "extra-index-url": [f"file://{index}", f"file://{tmp_path / 'gone'}", "https://example.org/simple"],
        "constraint": [str(constraints), str(tmp_path / "missing.txt")],
        "cert": ["/etc/ssl/certs/ca-certificates.crt"],
    })
    assert args == ["--index-strategy", "unsafe-best-match", "--index", f"file://{index}",
                    "--index", "https://example.org/simple", "--find-links", str(wheels),
                    "--constraint", str(constraints), "--native-tls"]
    # nothing configured: uv's defaults, with pip's choice among sources
    assert pip_sources.uv_args({}) == ["--index-strategy", "unsafe-best-match"]


def test_the_script_reads_pips_own_configuration(tmp_path):
    """`pip config list` as pip prints it, from a config file and an environment variable."""
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {tmp_path}\nextra-index-url = file://{tmp_path} file://{tmp_path}/gone\n")
    env = {"PIP_CONFIG_FILE": str(conf), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "pip_sources.py")], capture_output=True, text=True,
                         env=env, check=True).stdout
    args = shlex.split(out)
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    assert ["--find-links", str(tmp_path)] == args[args.index("--find-links"):args.index("--find-links") + 2]
    assert args.count("--index") == 1 and args[args.index("--index") + 1] == f"file://{tmp_path}"
