#!/usr/bin/env bash
# Instructions per model call of the orchestration game with recording (async callable),
# counted by callgrind: repeatable whatever else the machine is doing. The total at 600
# sessions minus the total at 100, over the 500 x 8 calls between them (start-up, compile
# and warm-up cancel out). With a commit, the same count on that commit's code, side by side.
#
#   bash bench/callgrind_orchestration.sh [REF]      (~4 min a side on a 2-core machine)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
count() {  # $1: sessions, $2: a --tree folder or empty
  local out; out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" "$PY" bench/bench_orchestration.py --child \
    --sessions "$1" --turns 8 --record --callable reply_async ${2:+--tree "$2"} >/dev/null 2>&1
  grep -m1 "^totals:\|^summary:" "$out" | awk '{print $2}'
  rm -f "$out"
}
per_call() {  # $1: a --tree folder or empty
  local a b; a=$(count 600 "$1"); b=$(count 100 "$1")
  echo $(( (a - b) / 4000 ))
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if [ $# -ge 1 ]; then
  tree=$("$PY" -c "import sys; sys.path.insert(0, 'bench'); sys.argv = ['x']
from pathlib import Path; import bench_orchestration as b; print(b.before_tree('$1', Path('$tmp')))")
  before=$(per_call "$tree")
  echo "at $1: $before instructions per call"
fi
now=$(per_call "")
echo "now: $now instructions per call"
if [ $# -ge 1 ]; then
  "$PY" -c "print(f'now / at $1: {$now / $before:.3f}')"
fi
