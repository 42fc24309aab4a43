"""The template filters' wording: what a reader sees in the cards and on the board."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from dashboard.templatetags.runcast import NONE, ago, signed_pct


def test_a_change_that_rounds_to_zero_has_no_sign() -> None:
    # The demo's board read "-0% vs 30 s ago" for a throughput change of -0.3%.
    assert signed_pct(-0.003) == "±0%"
    assert signed_pct(0.004) == "±0%"
    assert signed_pct(-0.02) == "-2%"
    assert signed_pct(0.51) == "+51%"
    assert signed_pct(None) == ""


def test_a_moment_under_a_minute_ago_is_just_now() -> None:
    # Django's timesince says "0 minutes": the card read "last seen 0 minutes ago".
    now = timezone.now()
    assert ago(now - timedelta(seconds=20), now) == "just now"
    assert ago(now - timedelta(minutes=3, seconds=5), now) == "3\xa0minutes ago"
    assert ago(None, now) == NONE


def test_an_abbreviation_several_zones_share_gets_its_offset() -> None:
    # The demo's drill flag read "finish slipped from 12-04 06:29 CST" (Asia/Shanghai, the
    # project's zone) beside the card's "Thu, Dec 3, 23:32 GMT+1": CST is also US Central, 14 h
    # away, and the Conference lane's cutoff is announced in Shanghai.
    from zoneinfo import ZoneInfo

    from forecasting.estimators import formatting as fmt

    t = 1796337720.0  # 2026-12-03 22:42 UTC
    assert fmt.when(t, ZoneInfo("Asia/Shanghai")) == "12-04 06:42 CST (UTC+8)"
    assert fmt.when(t, ZoneInfo("America/Chicago")) == "12-03 16:42 CST (UTC-6)"
    assert fmt.when(t, ZoneInfo("Asia/Kolkata")) == "12-04 04:12 IST (UTC+5:30)"
    assert fmt.when(t, ZoneInfo("Asia/Manila")) == "12-04 06:42 PST (UTC+8)"
    # Every name comes with its offset (the clock rule), not only the ambiguous ones.
    assert fmt.when(t, ZoneInfo("Europe/Berlin")) == "12-03 23:42 CET (UTC+1)"
    assert fmt.when(t, ZoneInfo("America/Los_Angeles")) == "12-03 14:42 PST (UTC-8)"
