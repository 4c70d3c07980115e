"""Suite-wide fixtures.

A helper module beside its tests (tests/train/reference_impls.py) is imported by name
without a sys.path insert: pytest's default import mode puts a test's folder first on
sys.path (the folders have no __init__.py, and no two test or helper modules share a
name). The specs' Python-backed fake models every folder uses (tests/fake_models.py,
tests/slow_model.py, which the python backend imports by name) and the loopback
OpenAI-compatible server (tests/fake_openai_server.py) sit beside this file, whose
folder pytest puts on sys.path the same way; a test that runs `askspec` in a subprocess
puts tests/ on its PYTHONPATH. Fixtures
shared across tests live in a conftest.py (this one, tests/train/conftest.py's `e2e`).

`tiny_model`: a tiny random Llama with SmolLM2's tokenizer and context (1 layer, hidden
size 16; a ~6 MB folder, built once a session). The training update tests and the
end-to-end training tests run on it: they check what an update, a schedule or a stage
did, not what a model learned, and a real SmolLM2 step costs seconds where this one costs
milliseconds.

Model checkpoints are freed when the test module whose runs wrote them finishes: a
SmolLM2-135M checkpoint with its optimizer state is ~1.6 GB, the training tests' module
fixtures keep their runs until the session ends, and a full run wrote ~24 GB of them
(enough to fill a CI disk). Freed per module, the peak is one module's checkpoints.

The suite's process is its own, as `askspec run`'s is: torch's CPU threads are set here
as the command sets them (no library module sets them: docs/architecture.md).

The order of the test files on pytest-xdist's workers: tests/suite_order.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    from askspec.runtime.backends.hf import default_threads

    # read by torch's OpenMP when it starts (torch is not imported here: most tests never need it)
    os.environ.setdefault("OMP_NUM_THREADS", str(default_threads()))
    if getattr(config.option, "dist", "no") == "loadfile":  # (on xdist's controller)
        config.option.loadscopereorder = False  # it keeps the order its workers collect in


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # on an xdist worker (the workers collect)
        from suite_order import order_items

        order_items(items)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers folder usable wherever a spec names weights: `hf("<this folder>")`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from askspec.runtime.backends.hf import resolve_weights

    folder = tmp_path_factory.mktemp("tiny_model")
    tok = AutoTokenizer.from_pretrained(str(resolve_weights("smollm2-135m-instruct")))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
                      eos_token_id=2, bos_token_id=1, tie_word_embeddings=True)
    with torch.random.fork_rng():  # the same weights every session, the tests' own seeds untouched
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def _checkpoint_dirs(base: Path) -> list[Path]:
    # a run's `checkpoints/ROLE/step-N/*.safetensors`; nothing else is named so in a test's tmp tree
    return sorted({p.parents[2] for p in base.rglob("checkpoints/*/step-*/*.safetensors")})


@pytest.fixture(scope="module", autouse=True)
def _free_checkpoints_after_module(tmp_path_factory: pytest.TempPathFactory):
    yield
    for folder in _checkpoint_dirs(tmp_path_factory.getbasetemp()):
        shutil.rmtree(folder, ignore_errors=True)
