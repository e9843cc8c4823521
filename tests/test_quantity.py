from __future__ import annotations

from decimal import Decimal

import pytest

from kratos_admit.domain.quantity import parse_positive_integer, parse_quantity


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, Decimal(1)),
        ("1", Decimal(1)),
        ("40Gi", Decimal(40 * 2**30)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        ("2k", Decimal(2000)),
        ("1e3", Decimal(1000)),
        (".5", Decimal("0.5")),
        ("1000,", None),
        ("", None),
        (" 1", None),
        ("1 Gi", None),
        ("abc", None),
        (True, None),
        (None, None),
    ],
)
def test_parse_quantity(value, expected):
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, 1),
        ("2", 2),
        ("1k", 1000),
        (0, None),
        ("0", None),
        ("1.5", None),
        ("500m", None),
        (-1, None),
        ("x", None),
    ],
)
def test_parse_positive_integer(value, expected):
    assert parse_positive_integer(value) == expected
