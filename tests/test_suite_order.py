"""The order the xdist workers take the test files in (tests/suite_order.py) and the
script that measures their seconds (scripts/test_durations.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from suite_order import DURATIONS, file_order

ROOT = Path(__file__).resolve().parents[1]


def test_multicore_files_are_spread_out_and_the_rest_go_longest_first():
    seconds = {"a": 50.0, "b": 40.0, "c": 30.0, "d": 20.0, "e": 10.0, "f": 5.0, "g": 1.0, "h": 0.5}
    multicore = {"a", "c", "h"}
    order = file_order(seconds, multicore)
    assert order == ["a", "b", "d", "c", "e", "f", "g", "h"]
    for i, name in enumerate(order):  # after each multicore file: its length of other files, or all that are left
        if name in multicore:
            others = [n for n in order[i + 1:] if n not in multicore]
            nxt = next((j for j in range(i + 1, len(order)) if order[j] in multicore), len(order))
            between = order[i + 1:nxt]
            assert sum(seconds[n] for n in between) >= seconds[name] or between == others, (name, order)
    rest = [n for n in order if n not in multicore]
    assert rest == sorted(rest, key=seconds.__getitem__, reverse=True)


def test_no_multicore_file_is_plain_longest_first():
    seconds = {"x": 1.0, "y": 3.0, "z": 2.0}
    assert file_order(seconds, set()) == ["y", "z", "x"]


def test_the_durations_name_test_files_that_exist():
    measured = json.loads(DURATIONS.read_text())
    missing = [name for name in measured if not (ROOT / name).is_file()]
    assert len(missing) <= len(measured) // 10, missing  # a few renamed files only cost their place
    assert all(isinstance(s, float | int) and s >= 0 for s in measured.values())


def test_the_script_sums_each_files_tests_from_a_junit_report(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_suite_order" name="t1" time="1.25"/>'
        '<testcase classname="tests.test_suite_order" name="t2" time="0.5"/>'
        '<testcase classname="tests.tui.test_tui_app" name="t3" time="2"/>'
        '</testsuite></testsuites>')
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import test_durations
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert test_durations.durations(report) == {"tests/test_suite_order.py": 1.8, "tests/tui/test_tui_app.py": 2.0}
    bad = tmp_path / "bad.xml"
    bad.write_text('<testsuites><testsuite><testcase classname="tests.nowhere" name="t" time="1"/></testsuite></testsuites>')
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_durations.py"), str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "no test file for JUnit classname 'tests.nowhere'" in proc.stderr
