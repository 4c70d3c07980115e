"""Writes tests/module_durations.json, the seconds each test module took, from the output
of a pytest run with `--durations=0` (read on stdin). tests/conftest.py hands .ci/run's
two workers the longest modules first (the longest-processing-time rule), so that neither
ends with one long module left while the other idles. Refresh it when modules grow or
move (a stale or missing figure only changes the order, never what runs):

    python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=0 \\
        | python scripts/module_durations.py
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "module_durations.json"
LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:call|setup|teardown)\s+(\S+?\.py)::")


def main() -> int:
    seconds: dict[str, float] = defaultdict(float)
    for line in sys.stdin:
        m = LINE.match(line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    if not seconds:
        print("no `--durations=0` lines on stdin", file=sys.stderr)
        return 1
    ranked = dict(sorted(((k, round(v, 1)) for k, v in seconds.items()), key=lambda kv: -kv[1]))
    OUT.write_text(json.dumps(ranked, indent=1) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(ranked)} modules, {sum(ranked.values()):.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
