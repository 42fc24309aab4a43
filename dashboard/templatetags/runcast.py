"""Formatting only: numbers, spans, money and timestamps as the pages print them."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from django import template

register = template.Library()

# Printed where a value is unknown: an en dash, as typeset tables do.
NONE = "\u2013"


@register.filter
def span(seconds: float | None) -> str:
    """6 h, 2 d, 12 min: the largest unit that reads naturally."""
    if seconds is None or not math.isfinite(seconds):
        return NONE
    s = abs(seconds)
    if s >= 2 * 86400:
        return f"{s / 86400:.0f} d"
    if s >= 3600:
        return f"{s / 3600:.1f} h".replace(".0 h", " h")
    if s >= 60:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


@register.filter
def moved(seconds: float | None) -> str:
    """How the ETA moved: 'slipped 6 h', 'gained 20 min', 'steady'."""
    if seconds is None:
        return ""
    if abs(seconds) < 60:
        return "steady"
    return f"slipped {span(seconds)}" if seconds > 0 else f"gained {span(seconds)}"


@register.filter
def pct(value: float | None, digits: int = 0) -> str:
    if value is None:
        return NONE
    return f"{value * 100:.{digits}f}%"


@register.filter
def signed_pct(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 100:+.0f}%"


@register.filter
def money(value: float | None, currency: str = "USD") -> str:
    if value is None:
        return NONE
    symbol = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥", "CNY": "¥"}.get(currency)
    amount = f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"
    return f"{symbol}{amount}" if symbol else f"{amount} {currency}"


@register.filter
def num(value: float | None, digits: int = 3) -> str:
    """Significant digits, for losses and rates."""
    if value is None or not math.isfinite(value):
        return NONE
    return f"{value:.{digits}g}"


@register.filter
def iso(epoch: float | datetime | None) -> str:
    if epoch is None:
        return ""
    if isinstance(epoch, datetime):
        return epoch.astimezone(UTC).isoformat()
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat()


@register.filter
def utc(epoch: float | None) -> str:
    """The server-side fallback text of a <time> element (JS rewrites it in local time)."""
    if epoch is None:
        return NONE
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%a %d %b %H:%M UTC")


@register.filter
def get(mapping: dict | None, key: str):  # type: ignore[type-arg]
    return (mapping or {}).get(key)
