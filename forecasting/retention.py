"""Retention of forecast rows: full history where it is read, one per hour beyond that.

Every computation stores an ETA, a loss and (for a run with a deadline) a deadline forecast,
keyed by its input, plus a ConditionReading row keyed by its time: ~23,000 rows per run-day at the
15 s cadence. What reads them:

* slip detection (`compute._slip_condition`): the run's first ETA and those of the last
  `SLIP_WINDOW_MAX_S` (3 days);
* "how the ETA moved" on the board and in the digest (`selectors.with_latest_forecasts`): the
  last 24 h; the run page's ETA chart: the newest 2,000 ETA forecasts (~8 h); every page: the
  newest of each kind;
* the flags' hysteresis (`hysteresis.sustained`): ConditionReading rows of the last
  `FLAG_SUSTAIN_MAX_S * FLAG_REOPEN_WINDOWS` (80 min).

So forecasts older than RUNCAST_FORECAST_FULL_DAYS (default 7, at least 4) are thinned to the
newest of each run, kind and RUNCAST_FORECAST_THIN_INTERVAL_S (default an hour), keeping each
run's first of each kind; ConditionReading rows older than RUNCAST_CONDITIONS_KEEP_HOURS
(default 24, at least 2) are deleted. Flags (state changes, the alert history) are all kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Max, Min

from config import sweeps
from forecasting.estimators import thresholds as th
from forecasting.models import ConditionReading, Forecast
from forecasting.selectors import MOVE_WINDOW

THINNED_KINDS = tuple(Forecast.Kind.values)
# Full history must cover everything that reads it (slip's window, "moved over 24 h"), a day
# more for a sweep that ran late.
MIN_FULL = max(timedelta(seconds=th.SLIP_WINDOW_MAX_S), MOVE_WINDOW) + timedelta(days=1)
MIN_CONDITIONS = timedelta(seconds=th.FLAG_SUSTAIN_MAX_S * th.FLAG_REOPEN_WINDOWS) + timedelta(
    minutes=40
)
DELETE_ROWS = 5_000  # per DELETE statement


@dataclass(frozen=True)
class ForecastThinResult:
    thinned: int  # forecasts older than the full window, deleted
    conditions: int  # ConditionReading rows deleted
    done: bool  # False when the time budget ran out first: the next tick continues


def windows() -> tuple[timedelta, float, timedelta]:
    """(full history, thinned interval in seconds, readings kept), from the settings."""
    full = timedelta(days=settings.RUNCAST_FORECAST_FULL_DAYS)
    every = settings.RUNCAST_FORECAST_THIN_INTERVAL_S
    hours = settings.RUNCAST_CONDITIONS_KEEP_HOURS
    return max(full, MIN_FULL), max(every, 60.0), max(timedelta(hours=hours), MIN_CONDITIONS)


def forecasts_thin(*, now: datetime, budget_s: float = 40.0) -> ForecastThinResult:
    """Apply the retention windows. Idempotent; stops after `budget_s` seconds."""
    full, every, keep_conditions = windows()
    began = time.monotonic()
    conditions = _delete_ids(
        ConditionReading,
        list(
            ConditionReading.objects.filter(computed_at__lt=now - keep_conditions).values_list(
                "id", flat=True
            )
        ),
    )
    cutoff = now - full
    # The (run, kind) pairs whose old rows outnumber the intervals they span: the others (every
    # ended run's history once thinned; at most about one row per interval) cost this one
    # aggregate, not a read of their rows every hour.
    pairs = (
        Forecast.objects.filter(kind__in=THINNED_KINDS, computed_at__lt=cutoff)
        .values("run_id", "kind")
        .annotate(n=Count("id"), lo=Min("computed_at"), hi=Max("computed_at"))
        .order_by("run_id", "kind")
    )
    thinned = 0
    for pair in pairs:
        if pair["n"] <= (pair["hi"] - pair["lo"]).total_seconds() // every + 2:
            continue
        run_id, kind = pair["run_id"], pair["kind"]
        if time.monotonic() - began > budget_s:
            return ForecastThinResult(thinned=thinned, conditions=conditions, done=False)
        with sweeps.unit("forecast thinning of run", f"{run_id} ({kind})"):
            thinned += _thin_one(run_id=run_id, kind=kind, cutoff=cutoff, every=every)
    return ForecastThinResult(thinned=thinned, conditions=conditions, done=True)


def _thin_one(*, run_id: int, kind: str, cutoff: datetime, every: float) -> int:
    rows = Forecast.objects.filter(run_id=run_id, kind=kind)
    first = rows.aggregate(at=Min("computed_at"))["at"]
    old = rows.filter(computed_at__lt=cutoff).order_by("computed_at", "id")
    keep_bucket: dict[int, int] = {}
    first_id = None
    ids = []
    for pk, at in old.values_list("id", "computed_at"):
        if first_id is None and at == first:
            first_id = pk  # slip measures the run's forecast lifetime from its first ETA
            continue
        ids.append(pk)
        # Ascending order: the last row seen in a bucket is its newest, the one kept.
        keep_bucket[int(at.timestamp() // every)] = pk
    kept = set(keep_bucket.values())
    return _delete_ids(Forecast, [pk for pk in ids if pk not in kept])


def _delete_ids(model: type[Forecast] | type[ConditionReading], ids: list[int]) -> int:
    deleted = 0
    for start in range(0, len(ids), DELETE_ROWS):
        count, _ = model.objects.filter(id__in=ids[start : start + DELETE_ROWS]).delete()
        deleted += count
    return deleted
