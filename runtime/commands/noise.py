"""Third-party console output off unless `--verbose`: the progress bars of the GGUF
conversion and weight loading, transformers' tokenizer warnings, Python warnings from
libraries. askspec's own lines (errors, warnings, progress) are unaffected."""

from __future__ import annotations

import logging
import os
import sys
import warnings

# Loggers of the libraries a run may pull in; errors still show.
LIBRARY_LOGGERS = ("transformers", "huggingface_hub", "accelerate", "torch", "gguf", "sentence_transformers",
                   "vllm", "httpx", "openai", "urllib3", "filelock")


def silence_libraries() -> None:
    """Make the libraries quiet for the rest of this process (call before they load;
    settings of those already loaded are changed too)."""
    # Read by the libraries when they (or their progress bars) start.
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TQDM_DISABLE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"(transformers|torch|huggingface_hub|accelerate|gguf|sentence_transformers|vllm)(\.|$)")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    if "transformers" in sys.modules:  # already imported: its settings were read then
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except Exception:  # an odd transformers version: its noise is not worth failing for
            pass
