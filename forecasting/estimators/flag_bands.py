"""Severity bands of the flags whose worsening is news by itself: a deadline's odds and a slip's
size (numpy-free: the flag writer, its hysteresis and the alert gate, which web workers import,
all compare them, so "worse" means one thing from the forecast to the message).

Kinds are named by their values ("deadline", "slip"): estimators import nothing of Django, so
not forecasting.models.Flag.Kind.
"""

from __future__ import annotations

import math

from forecasting.estimators import thresholds as th

DEADLINE = "deadline"
SLIP = "slip"


def odds_band(p_on_time: float) -> int:
    """0 above the first of FLAG_DEADLINE_BANDS (75%), one more below each: higher is worse."""
    return sum(p_on_time < b for b in th.FLAG_DEADLINE_BANDS)


def band(kind: str, data: object) -> int | None:
    """Which band a flag's or condition's data is in (None: a kind without bands, or no
    number to place)."""
    if not isinstance(data, dict):
        return None
    if kind == DEADLINE and _number(data.get("p_on_time")):
        return odds_band(float(data["p_on_time"]))
    if kind == SLIP and _number(data.get("amount_s")):
        return slip_band(float(data["amount_s"]))
    return None


def slip_band(amount_s: float) -> int:
    """0 up to twice FLAG_SLIP_BAND_BASE_S, one more for each doubling: higher is worse."""
    return int(math.log2(max(1.0, amount_s / th.FLAG_SLIP_BAND_BASE_S)))


def worse(kind: str, new: object, old: object) -> bool:
    """Whether `new` is in a worse band than `old` (False when either has none)."""
    a, b = band(kind, new), band(kind, old)
    return a is not None and b is not None and a > b


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
