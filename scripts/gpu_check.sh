#!/usr/bin/env bash
# The GPU check (docs/cluster.md, "GPU check"): the local trainer for two steps and the hf
# backend's batched generation on a tiny random Llama, and a one-step OpenRLHF job of
# specs/arith.ask where vLLM, OpenRLHF and Ray are installed; prints what ran, what was
# skipped and why, and the times. Under 8 minutes on one GPU; nothing is downloaded.
#
#   bash scripts/gpu_check.sh                      # cuda when torch sees a GPU, else cpu
#   GPU_CHECK_DEVICE=cpu bash scripts/gpu_check.sh # the CPU path (what the tests run)
#
# Python: $PYTHON, else the project's .venv, else python3 (which needs torch and
# transformers). Where `import askspec.runtime` fails (no install of the project), a link
# tree like scripts/typecheck.sh's (askspec/* plus runtime/ and tui/ as askspec.runtime and
# askspec.tui) goes on PYTHONPATH, in a temporary folder removed on exit.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 2
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY="$(command -v python3)"; fi
if ! "$PY" -c 'import torch, transformers' 2>/dev/null; then
  echo "gpu_check: $PY cannot import torch and transformers; set PYTHON to one that can" >&2
  exit 2
fi
# GPU_CHECK_LINK_TREE=1 uses the link tree even where askspec imports (the tests check that path)
if [ -n "${GPU_CHECK_LINK_TREE:-}" ] || ! "$PY" -c 'import askspec.runtime' 2>/dev/null; then
  TREE="$(mktemp -d)"
  trap 'rm -rf "$TREE"' EXIT
  . "$ROOT/scripts/link_tree.sh"
  link_tree "$ROOT" "$TREE"
  export PYTHONPATH="$TREE${PYTHONPATH:+:$PYTHONPATH}"
  echo "gpu_check: askspec from a link tree of this checkout on PYTHONPATH ($TREE)"
fi
timeout "${GPU_CHECK_TIMEOUT:-480}" "$PY" "$ROOT/scripts/gpu_check.py"
status=$?
[ "$status" = 124 ] && echo "gpu_check: FAILED: past ${GPU_CHECK_TIMEOUT:-480} s" >&2
exit "$status"
