"""Fixtures of the language tests (their shared paths and CLI runner: lang_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lang_helpers import EXAMPLES


@pytest.fixture(params=EXAMPLES, ids=[p.stem for p in EXAMPLES])
def spec(request) -> Path:
    return request.param
