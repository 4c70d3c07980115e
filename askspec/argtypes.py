"""Value types of the command line's flags (argparse ``type=``), shared by every command:
one wording per kind of value in the errors argparse prints."""

from __future__ import annotations

import argparse


def whole_number(text: str) -> int:
    """A count ≥ 0 (``--max-diagnostics``, ``--max-rows``, ...)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 0, got {text!r}")
    return n


def seconds(text: str) -> float:
    """A finite number of seconds ≥ 0 (``--timeout``)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds ≥ 0, got {text!r}")
    return value
