"""Specifications for how dollars print in summaries, reports and tuning tables."""

from __future__ import annotations

import math

import pytest

from overnight.jobs.accounting.money import money


@pytest.mark.parametrize(
    "value, shown",
    [
        (0, "$0"),
        (None, "–"),
        (12.344, "$12.34"),
        (0.000151, "$0.000151"),
        (1234.5, "$1,235"),  # half up: the banker's rule printed $1,234
        (99.996, "$100"),  # the decimals of the rounded amount: it printed $100.00
        (0.99996, "$1.00"),  # it printed $1.000
        (0.0099996, "$0.0100"),
        (-2.5, "$-2.50"),  # as before: a credit or a correction
        (1e-12, "$1.0e-12"),  # a cost, not "$0.0000000000" that reads as free
        (math.nan, "–"),  # a damaged figure: no traceback, no "$nan"
        (math.inf, "–"),
    ],
)
def test_dollars_print_with_the_decimals_their_rounded_size_needs(value, shown):
    assert money(value) == shown
