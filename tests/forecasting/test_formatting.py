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
        (90.0, "1 min 30 s"),
        (206.0, "3 min 26 s"),
        (180.4, "3 min"),
        (599.0, "9 min 59 s"),
        (600.0, "10 min"),
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
    # Letters always come with their offset: "CST" is Chicago, Havana and Shanghai.
    assert fmt.when(T0, ZoneInfo("America/New_York")) == "05-20 04:00 EDT (UTC-4)"
    assert fmt.when(T0, ZoneInfo("Europe/Berlin")) == "05-20 10:00 CEST (UTC+2)"
    assert fmt.when(T0, ZoneInfo("Asia/Shanghai")) == "05-20 16:00 CST (UTC+8)"
    assert fmt.when(T0 + 7, seconds=True) == "05-20 08:00:07 UTC"
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


def test_seconds_only_where_the_span_is_short() -> None:
    assert fmt.needs_seconds(40.0)
    assert fmt.needs_seconds(None, 3 * 86400.0, -40.0)
    assert not fmt.needs_seconds(600.0, None)
    assert not fmt.needs_seconds(float("nan"))


def test_one_figure_one_wording() -> None:
    """Seen: one figure written "+141% speed", "+141% throughput" and "140% more throughput"."""
    assert fmt.speedup(1.4051) == "+141% speed"
    assert fmt.speedup(0.004) == "+1% speed"
    assert fmt.speedup(None) == fmt.NONE


def test_a_step_between_logged_steps_is_rounded() -> None:
    """Seen: onset 2497 on the chart (cut), 2,498 in the email (rounded)."""
    assert fmt.step_at(2497.6) == 2498
    assert fmt.step_at(None) is None


def test_stamps_are_rendered_in_the_readers_zone() -> None:
    text = f"finish at {fmt.stamp(T0 + 7, seconds=True)}, was {fmt.stamp(T0)}"
    assert fmt.render_stamps(text) == "finish at 05-20 08:00:07 UTC, was 05-20 08:00 UTC"
    assert (
        fmt.render_stamps(text, ZoneInfo("Asia/Tokyo"))
        == "finish at 05-20 17:00:07 JST (UTC+9), was 05-20 17:00 JST (UTC+9)"
    )
    assert fmt.stamp_parts(text) == ["finish at ", (T0 + 7, True), ", was ", (T0, False)]
    assert fmt.render_stamps("no times") == "no times"


def test_a_loss_forecast_never_shows_a_p10_below_what_the_loss_can_be() -> None:
    dash = fmt.DASH
    # A P10 at or below zero is clipped to zero, and a band from zero is wider than its median:
    # said, not printed.
    assert fmt.loss_outlook(2.0, -0.1, 1.8, 2.3) == ("2", "", "spread too wide to forecast")
    assert fmt.loss_outlook(0.37421, 0.28114, 0.30123, 0.3254) == (
        "0.3742",
        "0.3012",
        f"P10{dash}P90 0.2811{dash}0.3254",
    )
    # Seen during a spike: "0.3742 -> 4479 (P10-P90 0-6224)": wider than its median.
    assert fmt.loss_outlook(0.3742, -1200.0, 4479.0, 6224.0) == (
        "0.3742",
        "",
        "spread too wide to forecast",
    )
    assert fmt.loss_outlook(3.0, 0.5, 2.5, 4.5, early=True)[2] == (
        "early: too few points to forecast"
    )
    assert fmt.loss_outlook(3.0, None, None, None) == ("3", "", "")
