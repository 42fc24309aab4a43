"""Formatting only: numbers, spans, money and timestamps as the pages print them."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

from forecasting.estimators import formatting as fmt
from forecasting.estimators.deadline import on_time_tone

register = template.Library()

NONE = fmt.NONE


@register.filter
def span(seconds: float | None) -> str:
    return fmt.span(seconds)


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
def speedup(value: float | None) -> str:
    """'+141% speed': the fix for 90% in the flag's and the message's words."""
    return fmt.speedup(value)


@register.filter
def fewer_steps(value: float | None) -> str:
    return fmt.fewer_steps(value)


@register.filter
def signed_pct(value: float | None) -> str:
    if value is None:
        return ""
    text = f"{value * 100:+.0f}%"
    # -0.3% rounds to "-0%", which reads as a drop; a change too small to show has no sign.
    return "±0%" if text in ("+0%", "-0%") else text


@register.filter
def ago(moment: datetime | None, now: datetime | None = None) -> str:
    """'3 minutes ago'; under a minute 'just now' (timesince alone says '0 minutes')."""
    if moment is None:
        return NONE
    now = now or timezone.now()
    if (now - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment, now)} ago"


@register.filter
def money(value: float | None, currency: str = "USD") -> str:
    return fmt.money(value, currency)


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
def utc(epoch: float | None, seconds: bool = False) -> str:
    """The server-side fallback text of a <time> element (JS rewrites it in local time)."""
    if epoch is None:
        return NONE
    form = "%a %d %b %H:%M:%S UTC" if seconds else "%a %d %b %H:%M UTC"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime(form)


@register.filter
def stamped(text: str | None) -> SafeString:
    """Stored text (a flag's explanation, a message's note) with each of its stamps as a
    <time> the browser writes in the viewer's zone (the clock rule); UTC without JS."""
    out = []
    for part in fmt.stamp_parts(str(text or "")):
        if isinstance(part, str):
            out.append(conditional_escape(part))
            continue
        epoch, seconds = part
        out.append(
            format_html(
                '<time data-fmt="{}" datetime="{}">{}</time>',
                "when-s" if seconds else "when",
                iso(epoch),
                fmt.when(epoch, seconds=seconds),
            )
        )
    return mark_safe("".join(out))  # noqa: S308 - every piece escaped above


@register.filter
def unstamped(text: str | None) -> str:
    """Stored text with its stamps in UTC: a title attribute's no-JS fallback (time.js
    rewrites it from `data-stamped-title` in the viewer's zone)."""
    return fmt.render_stamps(str(text or ""))


@register.filter
def seconds_if(name: str, short: bool) -> str:
    """A <time>'s data-fmt, to the second where the span is short ('short' -> 'short-s')."""
    return f"{name}-s" if short else name


@register.filter
def tone(p_on_time: float | None) -> str:
    """ok / warn / bad for a chance of making the cutoff ("" when unknown)."""
    return "" if p_on_time is None else on_time_tone(p_on_time)


@register.filter
def get(mapping: dict[str, Any] | None, key: str) -> Any:
    return (mapping or {}).get(key)
