"""Reads of forecasts and flags for pages and the API."""

from __future__ import annotations

from django.db.models import QuerySet

from forecasting.models import Flag, Forecast
from tracker.models import Run


def forecasts_latest(*, run: Run) -> dict[str, Forecast]:
    """The newest forecast of each kind."""
    latest: dict[str, Forecast] = {}
    for forecast in Forecast.objects.filter(run=run).order_by("kind", "-computed_at", "-id"):
        latest.setdefault(forecast.kind, forecast)
    return latest


def flags_open(*, run: Run) -> dict[str, Flag]:
    """The newest row per kind, for the kinds whose newest row is not resolved."""
    latest: dict[str, Flag] = {}
    for flag in Flag.objects.filter(run=run).order_by("kind", "-created_at", "-id"):
        latest.setdefault(flag.kind, flag)
    return {k: f for k, f in latest.items() if f.is_open}


def flag_history(*, run: Run, limit: int = 200) -> QuerySet[Flag]:
    return Flag.objects.filter(run=run).order_by("-created_at", "-id")[:limit]


def eta_history(
    *, run: Run, limit: int = 5000
) -> list[tuple[float, float | None, float | None, float | None]]:
    """(computed at, P10, P50, P90 finish) of every ETA forecast, oldest first, epoch seconds."""
    rows = (
        Forecast.objects.filter(run=run, kind=Forecast.Kind.ETA, finish_p50__isnull=False)
        .order_by("-computed_at")
        .values_list("computed_at", "finish_p10", "finish_p50", "finish_p90")[:limit]
    )
    return [(c.timestamp(), p10, p50, p90) for c, p10, p50, p90 in reversed(rows)]
