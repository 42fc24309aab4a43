"""How Runcast writes durations, money, steps and timestamps, everywhere: flag explanations,
alert messages, the digest and the pages. Django-free, so the estimators use it too.

Times always name their zone and its offset from UTC ("06-03 14:05 CET (UTC+1)"): a lead reading
"06-03 11:40" cannot tell whose 11:40 it is, and "CST" alone is three zones. Which zone is the
clock rule (docs/alerts.md, "Clock rule"): the reader's on pages, the project's in messages. Text
that is stored and read later (a flag's explanation) holds its times as stamps (`stamp`), and
each reader renders them in its own zone (`render_stamps`, the pages' `stamped` filter).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, tzinfo

DASH = "\u2013"  # an en dash, for ranges ("P10-P90" as typeset)
# Printed where a value is unknown: an en dash, as typeset tables do.
NONE = DASH
CURRENCY_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥", "CNY": "¥"}
DAY = 86400.0
# Below this a span is written to the second ("3 min 26 s") and so is a time read against it (a
# P10-P90 of a 3-minute run read "03:26 UTC - 03:26 UTC", a cutoff and a P50 finish 40 s apart
# "12:49 JST: P50 finish 12:49 JST").
SECONDS_BELOW_S = 600.0


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
    if s >= SECONDS_BELOW_S:
        return f"{s / 60:.0f} min"
    whole = round(s)
    if whole >= 60:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    return f"{whole} s"


def needs_seconds(*spans: float | None) -> bool:
    """Whether times read against these spans (the run's length, the gap between two times shown
    together) are written to the second: when any of them is under SECONDS_BELOW_S."""
    return any(s is not None and math.isfinite(s) and abs(s) < SECONDS_BELOW_S for s in spans)


def when(
    epoch_s: float | None,
    tz: tzinfo | None = None,
    *,
    zone: bool = True,
    time: bool = True,
    seconds: bool = False,
) -> str:
    """'06-03 11:40 CEST (UTC+2)' in the given zone (UTC by default), named unless `zone=False`;
    '06-03 11:40:07 ...' with `seconds` (see `needs_seconds`)."""
    if epoch_s is None or not math.isfinite(epoch_s):
        return NONE
    moment = datetime.fromtimestamp(epoch_s, tz=tz or UTC)
    text = moment.strftime(("%m-%d %H:%M:%S" if seconds else "%m-%d %H:%M") if time else "%m-%d")
    return f"{text} {zone_name(moment)}" if zone else text


def zone_name(moment: datetime) -> str:
    """'CET (UTC+1)', 'UTC'; 'UTC-3', 'UTC+5:45' where the zone has no letters (tzdata writes
    '-03', which after a time read as a subtraction: '05-28 17:26 -03'). Letters always come
    with the offset: CST is US Central (UTC-6), Cuba (UTC-5) and China (UTC+8), and a lead in
    Chicago read the demo's "cutoff 12-04 13:22 CST" (Shanghai) 14 h off."""
    name = moment.strftime("%Z")
    offset = _utc_offset(moment)
    if name in ("UTC", offset):
        return name
    if not name or name[0] in "+-":
        return offset
    return f"{name} ({offset})"


def _utc_offset(moment: datetime) -> str:
    """'UTC+8', 'UTC-3', 'UTC+5:45'."""
    offset = moment.utcoffset()
    minutes = round(offset.total_seconds() / 60) if offset is not None else 0
    if minutes == 0:
        return "UTC"
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


def speedup(fraction: float | None) -> str:
    """'+141% speed': what a run needs for 90% on time, in one name ("speed", "throughput" and
    "more throughput" were one figure; "speed" fits the board's narrow On-time column, as
    `speedup_for_p90` names it), rounded up, so 0.4% more is '+1%', never '+0%'."""
    if fraction is None or not math.isfinite(fraction):
        return NONE
    return f"+{math.ceil(fraction * 100 - 1e-9):.0f}% speed"


def fewer_steps(count: float | None) -> str:
    """'3,000 fewer steps', rounded up as `speedup` is: the cut that is enough."""
    if count is None or not math.isfinite(count):
        return NONE
    return f"{math.ceil(count - 1e-9):,.0f} fewer steps"


def on_time(
    p_on_time: float, speedup_for_p90: float | None, steps_cut_for_p90: float | None
) -> str:
    """A deadline flag's words for its odds: '44% likely on time; for 90% it needs +141% speed
    or 3,000 fewer steps' (the card and the message write the same parts)."""
    head = f"{p_on_time:.0%} likely on time"
    if speedup_for_p90 is None:
        return f"{head}; expected downtime alone uses up the time left"
    if speedup_for_p90 <= 0:
        return head
    return (
        f"{head}; for 90% it needs {speedup(speedup_for_p90)} or {fewer_steps(steps_cut_for_p90)}"
    )


def loss(value: float | None) -> str:
    """A loss level, in four significant digits wherever it is written: '0.3742', '4479'."""
    if value is None or not math.isfinite(value):
        return NONE
    return f"{value:.4g}"


def loss_outlook(
    now: float | None,
    p10: float | None,
    p50: float | None,
    p90: float | None,
    *,
    early: bool = False,
) -> tuple[str, str, str]:
    """A loss forecast as the board and the card write it: ('0.3742', '0.3012', 'P10-P90
    0.2811-0.3254'). A P10 never below zero for a loss that has been positive (what the loss
    can be); an interval wider than its own median says nothing a lead can use, and is said
    so instead of printed ('0.3742 -> 4479 (P10-P90 0-6224)' during a spike): ('0.3742', '',
    'spread too wide to forecast'), or 'early: ...' for an early forecast."""
    if p50 is None or not math.isfinite(p50):
        return loss(now), "", ""
    low = p10 if p10 is not None and math.isfinite(p10) else p50
    high = p90 if p90 is not None and math.isfinite(p90) else p50
    if now is not None and now > 0:
        low = max(low, 0.0)
    if high - low > abs(p50):
        why = "early: too few points to forecast" if early else "spread too wide to forecast"
        return loss(now), "", why
    return loss(now), loss(p50), f"P10{DASH}P90 {loss(low)}{DASH}{loss(high)}"


def step_at(value: float | None) -> int | None:
    """A step an estimator placed between two logged steps (an onset at 2497.6), as every
    reader shows it: rounded, not cut (the chart drew 2,498 where the email said 2,497)."""
    if value is None or not math.isfinite(value):
        return None
    return round(value)


# --- stamps: a time inside stored text, rendered in each reader's zone ------------------------
# "⟦<ISO UTC>⟧": an unrendered stamp still reads as an exact UTC time. ISO with seconds
# asks for seconds when rendered (`needs_seconds` decided when the text was written).
STAMP = re.compile(r"⟦(\d{4}-\d\d-\d\dT\d\d:\d\d(?::\d\d)?)Z⟧")


def stamp(epoch_s: float | None, *, seconds: bool = False) -> str:
    """A time to embed in text that is stored (a flag's explanation) and rendered later."""
    if epoch_s is None or not math.isfinite(epoch_s):
        return NONE
    moment = datetime.fromtimestamp(epoch_s, tz=UTC)
    return "⟦" + moment.strftime("%Y-%m-%dT%H:%M:%S" if seconds else "%Y-%m-%dT%H:%M") + "Z⟧"


def stamp_parts(text: str) -> list[str | tuple[float, bool]]:
    """`text` split into plain pieces and its stamps, each as (epoch seconds, with seconds)."""
    parts: list[str | tuple[float, bool]] = []
    last = 0
    for m in STAMP.finditer(text):
        if m.start() > last:
            parts.append(text[last : m.start()])
        iso = m.group(1)
        moment = datetime.fromisoformat(iso).replace(tzinfo=UTC)
        parts.append((moment.timestamp(), iso.count(":") == 2))
        last = m.end()
    if last < len(text):
        parts.append(text[last:])
    return parts


def render_stamps(text: str, tz: tzinfo | None = None) -> str:
    """Stored text with its stamps written in `tz` (a message: the project's zone)."""
    return "".join(
        p if isinstance(p, str) else when(p[0], tz, seconds=p[1]) for p in stamp_parts(text)
    )
