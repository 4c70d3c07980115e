#!/usr/bin/env bash
# Type-checks the packages askspec, askspec.runtime and askspec.tui with mypy (settings in
# pyproject.toml's [tool.mypy]); exits non-zero on any error.
#
# Why a link tree: runtime/ and tui/ install as askspec.runtime and askspec.tui through
# setuptools' package-dir, a mapping no type checker reads. Run from the repository root,
# mypy sees `askspec` without its runtime/tui subpackages (and the editable install's import
# hook is invisible to it). So we build, under build/typecheck/ (git-ignored), an `askspec`
# folder whose entries are symlinks to the repository's askspec/* plus `runtime` -> runtime/
# and `tui` -> tui/: the installed layout, with the sources edited in place. Paths in mypy's
# messages are mapped back to the repository's (askspec/runtime/x.py -> runtime/x.py).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
TREE="$ROOT/build/typecheck"
. "$ROOT/scripts/link_tree.sh"
link_tree "$ROOT" "$TREE"
cd "$TREE" || exit 2
"$PY" -m mypy --config-file "$ROOT/pyproject.toml" --cache-dir "$TREE/.mypy_cache" \
  -p askspec "$@" 2>&1 \
  | sed -e 's#^askspec/runtime/#runtime/#' -e 's#^askspec/tui/#tui/#'
exit "${PIPESTATUS[0]}"
