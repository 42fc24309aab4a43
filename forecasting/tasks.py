"""Thin Celery tasks: take ids, re-fetch, call a service. All idempotent (acks_late is on)."""

from __future__ import annotations

from celery import shared_task
from django.core.cache import cache

from forecasting import services


@shared_task(soft_time_limit=30, time_limit=45)
def forecast_run(run_id: int) -> None:
    # Clear the debounce marker first: data arriving during this computation schedules the next.
    cache.delete(f"runcast:forecast-pending:{run_id}")
    services.forecast_compute(run_id=run_id)


@shared_task(soft_time_limit=50, time_limit=55)
def sweep_active_runs() -> None:
    """Beat: liveness for every active run, and a forecast for each (the queue is only a hint)."""
    for run_id in services.runs_to_sweep():
        services.run_check_liveness(run_id=run_id)
        services.forecast_request(run_id=run_id)
