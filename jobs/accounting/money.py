"""One way to print dollars, for run summaries, reports and tuning tables."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

# The smallest amount printed in decimals; a cost below it (a few CPU milliseconds) is
# printed in scientific form rather than as a row of zeros that reads as free.
_SMALLEST = 1e-10


def _decimals(size: float) -> int:
    if size >= 100:
        return 0
    if size >= 1:
        return 2
    return min(10, -math.floor(math.log10(size)) + 2)


def money(value: float | None, none: str = "–") -> str:
    """Dollars with as many decimals as small unit costs need ($0.000151, $12.34, $1,235).

    Rounded half up, and the decimals chosen for the rounded amount: 99.996 is "$100", not
    "$100.00", and 0.99996 "$1.00", not "$1.000". A figure that is not a finite number (a
    damaged summary) prints as ``none``, never as "$nan" or a traceback."""
    if value is None or not math.isfinite(value):
        return none
    if value == 0:
        return "$0"
    size = abs(value)
    if size < _SMALLEST:
        return f"${value:.1e}"
    decimals = _decimals(size)
    rounded = Decimal(repr(value)).quantize(Decimal(1).scaleb(-decimals), ROUND_HALF_UP)
    again = _decimals(float(abs(rounded)))
    if again < decimals:  # rounding carried it into the next size (99.996 -> 100.00)
        decimals = again
        rounded = rounded.quantize(Decimal(1).scaleb(-decimals), ROUND_HALF_UP)
    return f"${rounded:,.{decimals}f}"
