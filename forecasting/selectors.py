"""Reads of forecasts and flags for pages and the API."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q, QuerySet

from forecasting.models import Flag, Forecast
from tracker.models import Run


def forecast_latest(*, run: Run, kind: str) -> Forecast | None:
    # The (run, kind, computed_at) index answers this without reading the run's history:
    # every forecast is kept, ~170k rows for a month-long run.
    return Forecast.objects.filter(run=run, kind=kind).order_by("-computed_at", "-id").first()


def forecasts_latest(*, run: Run) -> dict[str, Forecast]:
    """The newest forecast of each kind (one indexed query per kind)."""
    found = {kind: forecast_latest(run=run, kind=kind) for kind in Forecast.Kind.values}
    return {kind: f for kind, f in found.items() if f is not None}


def open_flags_by_run(run_ids: list[int]) -> dict[int, list[Flag]]:
    """The open flags of many runs in one query: newest row per (run, kind), not resolved.

    "Newest" is by (created_at, id): one computation writes its rows with one timestamp.
    """
    if not run_ids:
        return {}
    newer = Flag.objects.filter(run=OuterRef("run"), kind=OuterRef("kind")).filter(
        Q(created_at__gt=OuterRef("created_at"))
        | Q(created_at=OuterRef("created_at"), id__gt=OuterRef("id"))
    )
    rows = (
        Flag.objects.filter(run_id__in=run_ids)
        .annotate(superseded=Exists(newer))
        .filter(superseded=False)
        .exclude(state=Flag.State.RESOLVED)
        .order_by("-severity", "kind")
    )
    out: dict[int, list[Flag]] = {}
    for flag in rows:
        out.setdefault(flag.run_id, []).append(flag)
    return out


def flags_open(*, run: Run) -> dict[str, Flag]:
    """The open flags of one run by kind."""
    return {f.kind: f for f in open_flags_by_run([run.pk]).get(run.pk, [])}


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


def active_run_ids() -> list[int]:
    """Runs the sweeper checks and re-forecasts (the (status, last_seen_at) index serves it)."""
    return list(Run.objects.filter(status__in=Run.ACTIVE_STATUSES).values_list("pk", flat=True))
