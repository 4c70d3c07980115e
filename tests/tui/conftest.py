"""The TUI's tests never read or write the user's own state (column choices, log):
``$XDG_STATE_HOME`` is a fresh folder for each test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
