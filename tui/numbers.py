"""How the app prints a number: one helper, so a reward reads the same in a table cell,
a group's statistics, a metric and a comparison.

Four significant digits (``0.1235``, ``1.235e+06``); a float that is zero but for
rounding error (``-2.77556e-17``, what a mean of rewards that cancel comes out as) is
``0``; integers as they are; NaN and infinities by name."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

DIGITS = 4  # significant digits shown
TINY = 1e-12  # below this a float is rounding error around 0 (rewards are O(1); a tiny KL is 1e-6)


def number(value: Any, digits: int = DIGITS, sign: bool = False) -> str:
    """``value`` as the app prints it (``sign``: always with a sign, ``+0.5``)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:+d}" if sign else str(value)
    if isinstance(value, Decimal):
        value = float(value)
    if not isinstance(value, float):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if abs(value) < TINY:
        return "+0" if sign else "0"
    return f"{value:+.{digits}g}" if sign else f"{value:.{digits}g}"
