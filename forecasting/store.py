"""The one forecast store: every Forecast row is written here, keyed by its input."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from forecasting.models import Forecast
from tracker.models import Run


def forecast_store(
    *,
    run: Run,
    kind: str,
    last_step: int,
    now: datetime,
    data: dict[str, Any],
    finish: tuple[float | None, float | None, float | None] | None = None,
) -> Forecast:
    """Upsert the forecast of (run, kind, current segment, last step): recomputing on the same
    input updates the row, never duplicates it (the forecast_unique_input constraint)."""
    p10, p50, p90 = finish if finish else (None, None, None)
    forecast = Forecast(
        run=run,
        kind=kind,
        segment=run.current_segment,
        input_last_step=last_step,
        computed_at=now,
        data=data,
        finish_p10=p10,
        finish_p50=p50,
        finish_p90=p90,
    )
    # One INSERT ... ON CONFLICT statement: update_or_create took five (two savepoints, a
    # SELECT ... FOR UPDATE, the INSERT) for each of a computation's three to five forecasts.
    Forecast.objects.bulk_create(
        [forecast],
        update_conflicts=True,
        unique_fields=["run", "kind", "segment", "input_last_step"],
        update_fields=["computed_at", "data", "finish_p10", "finish_p50", "finish_p90"],
    )
    return forecast
