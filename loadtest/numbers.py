"""Numbers formatted by kind, the same in the terminal, the HTML report and `compare`.

Counts (requests, errors, concurrency) are integers; rates, times and shares of them carry 3
significant digits, without an exponent and without rounding off an integer part (1513.2
req/s reads 1513, not 1.51e+03 or 1510; 371.681 reads 372; 0.08213 ms reads 0.0821). A load
is a concurrency (an integer) in closed loop, and an offered rate in open loop.
"""

from __future__ import annotations

import math
from typing import Any

DIGITS = 3


def count(v: Any) -> str:
    """An integer: 8.0 concurrent reads 8."""
    return "-" if v is None else f"{round(float(v)):d}"


def sig(v: Any, digits: int = DIGITS, trim: bool = False) -> str:
    """`digits` significant digits; an integer part is kept whole. `trim` drops trailing zeros
    (for values a user typed, such as an offered rate of 8)."""
    if v is None:
        return "-"
    x = float(v)
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:.{decimals}f}"
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def load(v: Any, mode: str) -> str:
    """A stage's load: concurrency in closed loop, offered req/s otherwise."""
    if v is None:
        return "-"
    return count(v) if mode == "closed" and float(v) == round(float(v)) else sig(v, trim=True)
