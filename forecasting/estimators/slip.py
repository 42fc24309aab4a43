"""Is the finish slipping? Compare the P50 finish of the forecasts kept over a recent window.

A run slips when its P50 finish moved later by more than a share of the time that was still to
go when the window began (and by more than a minimum), so a 10-minute run and a 10-day run are
judged on the same relative scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forecasting.estimators import thresholds as th
from forecasting.estimators.formatting import needs_seconds, span, stamp
from forecasting.estimators.jsonable import as_json


@dataclass
class SlipResult:
    slipping: bool
    from_finish: float  # P50 finish at the start of the slip (epoch seconds)
    to_finish: float  # latest P50 finish
    since: float  # forecast time when the finish started moving later
    amount_s: float  # to_finish - from_finish
    window_s: float  # length of the window that was examined
    explanation: str

    def to_dict(self) -> dict[str, float | bool | str | None]:
        return as_json(self)


def window_length(first_time: float, last_finish: float) -> float:
    """Window length: a share of the run's forecast lifetime so far plus what is left (from its
    first forecast's time to its latest P50 finish)."""
    lifetime = max(0.0, float(last_finish) - float(first_time))
    return min(th.SLIP_WINDOW_MAX_S, max(th.SLIP_WINDOW_MIN_S, th.SLIP_WINDOW_FRACTION * lifetime))


def detect_slip(
    forecast_times: np.ndarray,
    p50_finishes: np.ndarray,
    *,
    now: float,
) -> SlipResult | None:
    """Slip over the recent window of kept forecasts, or None with too few of them.

    What it reads of them, and all a caller must pass (forecasting.selectors.slip_history): the
    first forecast, the latest, and of those inside the window the one with the earliest
    lowest finish and enough of the latest to tell SLIP_MIN_FORECASTS are there.

    The explanation holds its times as stamps: each reader writes them in its own zone (the
    clock rule, docs/alerts.md), to the second when the slip or the time left is short."""
    t = np.asarray(forecast_times, dtype=float)
    f = np.asarray(p50_finishes, dtype=float)
    ok = np.isfinite(t) & np.isfinite(f) & (t <= now)
    t, f = t[ok], f[ok]
    if t.size < th.SLIP_MIN_FORECASTS:
        return None
    order = np.argsort(t, kind="stable")
    t, f = t[order], f[order]
    window = window_length(t[0], f[-1])
    inside = t >= now - window
    if inside.sum() < th.SLIP_MIN_FORECASTS:
        return None
    wt, wf = t[inside], f[inside]
    # The slip starts at the earliest finish in the window: later moves are measured from there.
    low = int(np.argmin(wf))
    from_finish, since = float(wf[low]), float(wt[low])
    to_finish = float(wf[-1])
    amount = to_finish - from_finish
    remaining = max(from_finish - since, 1.0)
    slipping = amount > max(th.SLIP_MIN_S, th.SLIP_REL_THRESHOLD * remaining)
    over = span(now - since)
    seconds = needs_seconds(amount, to_finish - now)
    if slipping:
        text = (
            f"finish slipped from {stamp(from_finish, seconds=seconds)} to"
            f" {stamp(to_finish, seconds=seconds)} over {over} (+{span(amount)})"
        )
    else:
        text = f"finish steady at {stamp(to_finish, seconds=seconds)} over the last {span(window)}"
    return SlipResult(
        slipping=bool(slipping),
        from_finish=from_finish,
        to_finish=to_finish,
        since=since,
        amount_s=float(amount),
        window_s=float(window),
        explanation=text,
    )
