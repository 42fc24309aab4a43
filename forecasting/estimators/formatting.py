"""How Runcast writes durations, money, steps and timestamps, everywhere: flag explanations,
alert messages, the digest and the pages. Django-free, so the estimators use it too.

Times always name their zone: a lead reading "06-03 11:40" cannot tell whose 11:40 it is.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, tzinfo

# Printed where a value is unknown: an en dash, as typeset tables do.
NONE = "\u2013"
CURRENCY_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥", "CNY": "¥"}
DAY = 86400.0


def _trim(value: float) -> str:
    """One decimal, without a trailing '.0'."""
    return f"{value:.1f}".removesuffix(".0")


def span(seconds: float | None) -> str:
    """'40 s', '12 min', '6.5 h', '1 day', '5.2 days', '12 days': the largest natural unit."""
    if seconds is None or not math.isfinite(seconds):
        return NONE
    s = abs(seconds)
    if s >= DAY:
        days = s / DAY
        text = f"{days:.0f}" if days >= 10 else _trim(days)
        return f"{text} day" if text == "1" else f"{text} days"
    if s >= 3600:
        return f"{_trim(s / 3600)} h"
    if s >= 60:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


def when(
    epoch_s: float | None, tz: tzinfo | None = None, *, zone: bool = True, time: bool = True
) -> str:
    """'06-03 11:40 CEST' in the given zone (UTC by default), named unless `zone=False`."""
    if epoch_s is None or not math.isfinite(epoch_s):
        return NONE
    moment = datetime.fromtimestamp(epoch_s, tz=tz or UTC)
    text = moment.strftime("%m-%d %H:%M" if time else "%m-%d")
    return f"{text} {zone_name(moment)}" if zone else text


# Abbreviations tzdata gives zones with different offsets: CST is US Central (UTC-6), Cuba
# (UTC-5) and China (UTC+8); IST India, Israel and Ireland; PST the US Pacific and the
# Philippines. A lead in Chicago read the demo's "cutoff 12-04 13:22 CST" (Shanghai) 14 h off.
AMBIGUOUS_ZONES = frozenset({"CST", "CDT", "IST", "PST"})


def zone_name(moment: datetime) -> str:
    """'CEST', 'UTC'; 'UTC-3', 'UTC+5:45' where the zone has no letters (tzdata writes '-03',
    which after a time read as a subtraction: '05-28 17:26 -03'); 'CST (UTC+8)' where the
    letters name several zones."""
    name = moment.strftime("%Z")
    if name in AMBIGUOUS_ZONES:
        return f"{name} ({_utc_offset(moment)})"
    if not name or name[0] not in "+-":
        return name
    return _utc_offset(moment)


def _utc_offset(moment: datetime) -> str:
    """'UTC+8', 'UTC-3', 'UTC+5:45'."""
    offset = moment.utcoffset()
    minutes = round(offset.total_seconds() / 60) if offset is not None else 0
    sign = "-" if minutes < 0 else "+"
    hours, rest = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours}" + (f":{rest:02d}" if rest else "")


def money(amount: float | None, currency: str = "USD") -> str:
    """'$159,744', '$3.20', '120 CHF': whole units from 100 up, cents below."""
    if amount is None or not math.isfinite(amount):
        return NONE
    text = f"{amount:,.0f}" if abs(amount) >= 100 else f"{amount:,.2f}"
    symbol = CURRENCY_SYMBOLS.get(currency)
    return f"{symbol}{text}" if symbol else f"{text} {currency}"


def steps(value: float | None) -> str:
    """'41,200'."""
    if value is None or not math.isfinite(value):
        return NONE
    return f"{value:,.0f}"
