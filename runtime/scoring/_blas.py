"""Single-threaded BLAS for the scoring layer's small linear algebra.

The scoring kernels are small: L-BFGS-B on N ~ 8 strengths, one 5,000 x 384
matrix-vector product per diversity score. Multi-threaded OpenBLAS adds a thread
hand-off to each call, and on a loaded 2-core machine that dominated: measured mean
1.2-3.4 ms (p95 8-16 ms) per window score with 2 threads vs 0.26-0.57 ms (p95
0.4-4.4 ms) with 1, and L-BFGS-B fits of 60-140 ms vs ~2 ms (docs/benchmarks_scoring.md).
The limit is process-wide while the block runs (tens of microseconds) and touches only
the BLAS libraries numpy/scipy loaded, not torch's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from functools import lru_cache


@lru_cache(maxsize=1)
def _controller():
    try:  # a dependency of scikit-learn, hence of sentence-transformers; optional here
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - only without threadpoolctl
        return None
    import scipy.optimize  # noqa: F401  (load scipy's BLAS before the controller scans)

    return ThreadpoolController()


_lock = threading.Lock()
_depth = 0
_limiter = None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Limit BLAS to one thread inside the block (a no-op without threadpoolctl).

    Reference-counted under a lock: threadpoolctl's limiter saves and restores the
    current limits, so overlapping blocks from several threads would otherwise restore
    each other's "1" and leave BLAS single-threaded for good.
    """
    global _depth, _limiter
    ctl = _controller()
    if ctl is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _limiter = ctl.limit(limits=1, user_api="blas")
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _limiter = None
