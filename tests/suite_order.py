"""The order in which pytest-xdist deals the test files out to its workers (`--dist
loadfile`, as .ci/run runs them; tests/conftest.py applies it where the workers collect,
and turns xdist's own reordering off on the controller).

Longest first, from each file's seconds measured in a CI run (tests/durations.json; a file
not listed there counts UNKNOWN_TEST_S a test), except that the files marked `multicore`
(Ray actors, a job's driver with its launches: more than one busy core) are spread out,
each followed by at least its own length of other files. Why, measured on the 2-core
machine: xdist's own order (most tests first) left the few-test end-to-end files for last,
queued on one worker while the other ran out of work (a minute of one idle core); longest
first ran the multicore files side by side at the start, each slower by a quarter.

Refresh the figures with `python scripts/test_durations.py build/junit.xml` after a .ci/run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_TEST_S = 0.2  # a test of a file the durations do not list yet (most tests take less)


def order_items(items: list[pytest.Item]) -> None:
    """Each file's tests together, the files in `file_order`."""
    measured = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    seconds = {name: measured.get(name, UNKNOWN_TEST_S * len(its)) for name, its in files.items()}
    multicore = {name for name, its in files.items() if any(i.get_closest_marker("multicore") for i in its)}
    items[:] = [item for name in file_order(seconds, multicore) for item in files[name]]


def file_order(seconds: dict[str, float], multicore: set[str]) -> list[str]:
    """Longest first; after each multicore file, other files of at least its seconds."""
    rest = sorted((f for f in seconds if f not in multicore), key=seconds.__getitem__, reverse=True)
    order: list[str] = []
    for name in sorted(multicore, key=seconds.__getitem__, reverse=True):
        order.append(name)
        owed = seconds[name]
        while owed > 0 and rest:
            order.append(rest.pop(0))
            owed -= seconds[order[-1]]
    return order + rest
