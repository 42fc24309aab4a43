"""Thin Celery tasks: take ids, re-fetch, call a service. All idempotent (acks_late is on).

Enqueueing lives here too (never in services, which know no Celery): receivers and the sweeper
call `forecast_enqueue`.
"""

from __future__ import annotations

import math
from typing import Any

from celery import shared_task
from celery.signals import worker_init
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from config import sweeps
from forecasting import retention, selectors
from tracker import pacing

# `forecasting.compute` and `forecasting.liveness` (the estimators: scipy and pandas;
# ~100 MB per process) are imported inside the tasks, not here: web workers import this module to
# enqueue and must not carry the forecasting stack they never run (tests/test_memory.py keeps it
# that way).

# A run sends a batch every second or so; forecasting each would be waste. One forecast per
# run per interval, computed after the interval so it sees everything that arrived meanwhile.
FORECAST_DEBOUNCE_S = 15


def forecast_interval(live: int | None = None) -> float:
    """Seconds between one run's forecasts: FORECAST_DEBOUNCE_S while the live runs' forecasts
    fit RUNCAST_FORECASTS_PER_S, else live runs / that budget, at most
    RUNCAST_FORECAST_INTERVAL_MAX_S. A worker that cannot keep every run at 15 s otherwise
    falls behind on all of them at once: its queue grows and every forecast arrives later by
    the whole backlog. Slowing each run's cadence first keeps all of them fresh (at most
    30 s old by default) up to twice as many runs; past that the queue grows again. The count
    is tracker.pacing's, taken at most every 30 s per process (no query per batch)."""
    budget = settings.RUNCAST_FORECASTS_PER_S
    if budget <= 0:
        return float(FORECAST_DEBOUNCE_S)
    count = pacing.live_runs() if live is None else live
    # Whole seconds: the marker's timeout and the task's countdown are both in seconds.
    paced = math.ceil(count / budget)
    return float(max(FORECAST_DEBOUNCE_S, min(settings.RUNCAST_FORECAST_INTERVAL_MAX_S, paced)))


def _pending_key(run_id: int) -> str:
    return f"runcast:forecast-pending:{run_id}"


def forecast_enqueue(*, run_id: int, immediate: bool = False) -> bool:
    """Enqueue a debounced forecast of one run; return whether a task was enqueued."""
    if immediate:
        forecast_run.delay(run_id)
        return True
    interval = forecast_interval()
    # cache.add is atomic: of all batches in the window, exactly one enqueues.
    if not cache.add(_pending_key(run_id), 1, timeout=int(interval)):
        return False
    forecast_run.apply_async(args=[run_id], countdown=interval)
    return True


@shared_task(soft_time_limit=30, time_limit=45)
def forecast_run(run_id: int) -> None:
    # Clear the debounce marker first: data arriving during this computation schedules the next.
    cache.delete(_pending_key(run_id))
    from forecasting import compute

    compute.forecast_compute(run_id=run_id)


@shared_task(soft_time_limit=50, time_limit=55)
def sweep_active_runs() -> None:
    """Beat: liveness for every active run, and a forecast for each (the queue is only a hint)."""
    from forecasting import liveness

    if not liveness.server_listening(probe_url=settings.RUNCAST_WEB_PROBE_URL):
        return  # the web tier is down: clients spool, and nobody's silence is their own
    for run_id in selectors.active_run_ids():
        with sweeps.unit("liveness of run", run_id):
            try:
                liveness.run_check_liveness(run_id=run_id)
            finally:
                # A run whose liveness check fails is still forecast.
                forecast_enqueue(run_id=run_id)


@shared_task(soft_time_limit=50, time_limit=55)
def sweep_gpu_hosts() -> None:
    """Beat: check the GPU activity of every host an agent reported from in the last minutes.

    A sweep rather than a task per batch: agents send every few seconds, and an episode is only
    judged once it has ended, so a check every 30 s loses nothing.
    """
    from forecasting.gpu import check as gpu_check
    from forecasting.gpu import selectors as gpu_selectors

    for host_id in gpu_selectors.recently_seen_host_ids():
        with sweeps.unit("GPU check of host", host_id):
            gpu_check.gpu_check_host(host_id=host_id)


@shared_task(soft_time_limit=120, time_limit=150)
def forecasts_thin() -> None:
    """Beat: thin old forecasts and drop old CONDITIONS rows (forecasting/retention.py)."""
    retention.forecasts_thin(now=timezone.now(), budget_s=90.0)


@worker_init.connect
def _preload_forecasting(**kwargs: Any) -> None:
    # In a Celery worker the stack is wanted: import it once in the parent before the pool
    # forks, so every prefork child shares those pages (copy-on-write) instead of importing its
    # own copy, and no child's first forecast waits a second for the imports.
    from forecasting import compute, liveness  # noqa: F401
