"""Suite-wide fixtures.

Model checkpoints are freed when the test module whose runs wrote them finishes: a
SmolLM2-135M checkpoint with its optimizer state is ~1.6 GB, the training tests' module
fixtures keep their runs until the session ends, and a full run wrote ~24 GB of them
(enough to fill a CI disk). Freed per module, the peak is one module's checkpoints.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def _checkpoint_dirs(base: Path) -> list[Path]:
    # a run's `checkpoints/ROLE/step-N/*.safetensors`; nothing else is named so in a test's tmp tree
    return sorted({p.parents[2] for p in base.rglob("checkpoints/*/step-*/*.safetensors")})


@pytest.fixture(scope="module", autouse=True)
def _free_checkpoints_after_module(tmp_path_factory: pytest.TempPathFactory):
    yield
    for folder in _checkpoint_dirs(tmp_path_factory.getbasetemp()):
        shutil.rmtree(folder, ignore_errors=True)
