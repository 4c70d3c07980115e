"""Writes tests/durations.json, each test file's seconds, from a pytest JUnit XML report.

    python scripts/test_durations.py build/junit.xml

.ci/run writes that report. tests/suite_order.py orders the files on the xdist workers
by these figures (how and why: its docstring). A test's time in the report is its
setup, call and teardown together, so a module fixture counts in its file's first test.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "durations.json"


def file_of(classname: str) -> str:
    """The test file of a JUnit classname: `tests.tui.test_app` or `tests.tui.test_app.TestX`."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return path
    raise SystemExit(f"no test file for JUnit classname {classname!r}")


def durations(report: Path) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = file_of(case.get("classname", ""))
        seconds[name] = seconds.get(name, 0.0) + float(case.get("time", 0.0))
    return {name: round(s, 1) for name, s in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    found = durations(Path(argv[0]))
    OUT.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")
    print(f"{OUT.relative_to(ROOT)}: {len(found)} files, {sum(found.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
