"""``Loader``: the one way widgets call the data layer — in a thread worker, never on
the UI thread; the result comes back as a ``Loaded``/``LoadFailed`` message."""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

from textual.worker import get_current_worker

from askspec.tui.data import DataError, one_line
from askspec.tui.messages import Loaded, LoadFailed


class Loader:
    """Mixin for widgets and screens (anything with ``run_worker``/``post_message``)."""

    def load(self, key: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in a thread; a newer load under the same key supersedes it."""
        self.run_worker(  # type: ignore[attr-defined]
            partial(self._load_in_thread, key, fn, args), thread=True, exclusive=True,
            group=f"load:{id(self)}:{key}", exit_on_error=False, name=f"load {key}",
        )

    def _load_in_thread(self, key: str, fn: Callable[..., Any], args: tuple) -> None:
        worker = get_current_worker()
        t0 = time.perf_counter()
        try:
            msg: Loaded | LoadFailed = Loaded(key, fn(*args), time.perf_counter() - t0)
        except DataError as e:
            msg = LoadFailed(key, str(e))
        except Exception as e:  # a bug or an unexpected store state: say it, keep running
            msg = LoadFailed(key, f"{type(e).__name__}: {one_line(e)}")
        if not worker.is_cancelled:
            self.post_message(msg)  # type: ignore[attr-defined]  # thread-safe
