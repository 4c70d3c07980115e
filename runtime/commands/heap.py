"""Garbage collection while sessions run: full collections scan the run's own objects.

By the time a run starts, the process holds everything it imported and prepared (the
runtime's modules, DuckDB, pyarrow, a backend's weights and tokenizer: hundreds of
thousands of objects that live as long as the process). A full collection walks all of
them, ~50 ms each on the project's machine, and a run of instant calls (scripted
opponents, samplers, replay) triggers one every few thousand calls: ~3 µs a call, a
tenth of the engine's own cost. `gc.freeze()` moves what exists when a phase starts into
the collector's permanent generation, which no collection scans; `gc.unfreeze()` gives it
back when the last phase in flight ends, so nothing that became garbage meanwhile is kept
beyond the run. Reference counting frees objects as usual throughout; only cycles among
the frozen objects wait for the unfreeze.

The collector is the process's, so this is the command's to do: `askspec run` hands
`frozen_heap` to its engine (`Engine(around_phase=...)`); an engine embedded in another
program leaves that program's collector alone.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

_depth = 0  # phases in flight (a trainer's steps, nested or concurrent engines)
_ours = False  # whether the freeze in place is this module's (a process that froze its heap itself keeps it)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """While the block runs, collections leave alone the objects that existed before it."""
    global _depth, _ours
    if _depth == 0 and gc.isenabled() and gc.get_freeze_count() == 0:
        gc.freeze()
        _ours = True
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _ours:
            _ours = False
            gc.unfreeze()
