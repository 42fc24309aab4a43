"""The one way Runcast writes durations, money, steps and times."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from forecasting.estimators import formatting as fmt

DAY = 86400.0
T0 = datetime(2025, 5, 20, 8, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5.0, "5 s"),
        (90.0, "2 min"),
        (-720.0, "12 min"),
        (3600.0, "1 h"),
        (6.5 * 3600, "6.5 h"),
        (DAY, "1 day"),
        (2 * DAY, "2 days"),
        (5.2 * DAY, "5.2 days"),
        (12.4 * DAY, "12 days"),
        (None, fmt.NONE),
        (float("nan"), fmt.NONE),
    ],
)
def test_span(seconds: float | None, text: str) -> None:
    assert fmt.span(seconds) == text


def test_times_name_their_zone() -> None:
    assert fmt.when(T0) == "05-20 08:00 UTC"
    assert fmt.when(T0, ZoneInfo("America/New_York")) == "05-20 04:00 EDT"
    assert fmt.when(T0, zone=False) == "05-20 08:00"
    # Zones tzdata names by offset only read as an offset, not as a subtraction after the time.
    assert fmt.when(T0, ZoneInfo("America/Sao_Paulo")) == "05-20 05:00 UTC-3"
    assert fmt.when(T0, ZoneInfo("Asia/Kathmandu")) == "05-20 13:45 UTC+5:45"
    assert fmt.when(T0, ZoneInfo("Asia/Dubai")) == "05-20 12:00 UTC+4"
    assert fmt.when(None) == fmt.NONE


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (159_744.2, "USD", "$159,744"),
        (3.2, "EUR", "€3.20"),
        (120.0, "CHF", "120 CHF"),
        (None, "USD", fmt.NONE),
    ],
)
def test_money(amount: float | None, currency: str, text: str) -> None:
    assert fmt.money(amount, currency) == text


def test_steps() -> None:
    assert fmt.steps(41_200) == "41,200"
    assert fmt.steps(None) == fmt.NONE
