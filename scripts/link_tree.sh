# Sourced by scripts that need askspec importable in its installed layout without the
# editable install (typecheck.sh, gpu_check.sh): `link_tree ROOT TREE` makes TREE/askspec,
# whose entries are symlinks to ROOT/askspec/* plus `runtime` -> ROOT/runtime and `tui` ->
# ROOT/tui (setuptools' package-dir mapping, which neither mypy nor a bare PYTHONPATH reads),
# so the sources are used in place.
link_tree() {
  local root="$1" tree="$2" entry name
  rm -rf "$tree/askspec"
  mkdir -p "$tree/askspec"
  for entry in "$root"/askspec/*; do
    name="$(basename "$entry")"
    case "$name" in __pycache__|runtime|tui) continue ;; esac
    ln -s "$entry" "$tree/askspec/$name"
  done
  ln -s "$root/runtime" "$tree/askspec/runtime"
  ln -s "$root/tui" "$tree/askspec/tui"
}
