"""One way to print dollars, for run summaries, reports and tuning tables."""

from __future__ import annotations

import math


def money(value: float | None, none: str = "–") -> str:
    """Dollars with as many decimals as small unit costs need ($0.000151, $12.34, $1,234)."""
    if value is None:
        return none
    if value == 0:
        return "$0"
    size = abs(value)
    if size >= 100:
        return f"${value:,.0f}"
    if size >= 1:
        return f"${value:,.2f}"
    decimals = min(10, -math.floor(math.log10(size)) + 2)
    return f"${value:.{decimals}f}"
