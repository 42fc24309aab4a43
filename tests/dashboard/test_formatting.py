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
