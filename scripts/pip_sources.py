"""Prints uv's arguments for the package sources pip is configured with on this machine.

scripts/setup.sh installs with uv where it can, and uv does not read pip's configuration
(pip.conf, PIP_* variables). The wheel folders (find-links), indexes and constraint files
pip would use are read from `pip config list` and passed on, with pip's choice among
sources (the best version from any of them: uv's `unsafe-best-match`, not its default of
the first index that has the package). A file:// index that is not on disk is left out, as
pip ignores it; pip's certificate bundle is uv's too (SSL_CERT_FILE, set by setup.sh).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse


def pip_config() -> dict[str, list[str]]:
    """Each pip setting's values (later scopes win, as in pip: env over global)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    settings: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        settings[name] = shlex.split(value.strip().strip("'").strip('"'))
    return settings


def reachable(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme != "file" or Path(parsed.path).is_dir()


def uv_args(settings: dict[str, list[str]]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match"]
    for url in settings.get("index-url", []):
        args += ["--default-index", url]
    for url in settings.get("extra-index-url", []):
        if reachable(url):
            args += ["--index", url]
    for folder in settings.get("find-links", []):
        args += ["--find-links", folder]
    for path in settings.get("constraint", []):
        if Path(path).is_file():
            args += ["--constraint", path]
    if settings.get("cert"):
        args.append("--native-tls")
    return args


if __name__ == "__main__":
    print(shlex.join(uv_args(pip_config())))
