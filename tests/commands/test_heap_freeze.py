"""runtime/commands/heap.py: objects that exist when a phase starts are left out of
collections while it runs, and given back (collectable) when the last phase ends.
(`askspec run` hands it to its engine; tests/commands/test_process_settings.py checks
that the command's runs freeze and an embedded run does not.)"""

from __future__ import annotations

import gc
import weakref

from askspec.runtime.commands import heap
from askspec.runtime.commands.heap import frozen_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_old_cycles_wait_for_the_end_of_the_run_then_are_collected():
    gc.collect()
    assert heap._depth == 0
    before = _Node()
    ref = weakref.ref(before)
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        del before
        gc.collect()
        assert ref() is not None  # frozen: no collection looks at it
        with frozen_heap():  # a nested phase neither freezes again nor unfreezes
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None


def test_new_cycles_are_collected_during_the_run():
    with frozen_heap():
        made = _Node()
        ref = weakref.ref(made)
        del made
        gc.collect()
        assert ref() is None


def test_a_heap_frozen_by_the_process_stays_frozen():
    gc.collect()  # an earlier test's abandoned engine coroutine ends its phase when collected
    assert heap._depth == 0
    kept = _Node()
    ref = weakref.ref(kept)
    gc.freeze()
    try:
        with frozen_heap():
            pass
        # The count itself may fall while other threads free frozen objects by reference
        # count, so the check follows one object: still frozen, so no collection frees it.
        assert gc.get_freeze_count() > 0
        del kept
        gc.collect()
        assert ref() is not None
    finally:
        gc.unfreeze()
    gc.collect()
    assert ref() is None
