"""The Celery app, its queues and every periodic schedule, in one place.

Forecasting never shares a queue with alert delivery: a backlog of forecasts must not delay a page.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from django.conf import settings
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

app = Celery("runcast")
app.config_from_object("django.conf:settings", namespace="CELERY")

QUEUE_FORECASTING = "forecasting"
QUEUE_ALERTS = "alerts"
QUEUE_DEFAULT = "default"

app.conf.update(
    task_queues=[Queue(QUEUE_DEFAULT), Queue(QUEUE_FORECASTING), Queue(QUEUE_ALERTS)],
    task_default_queue=QUEUE_DEFAULT,
    task_routes={
        "forecasting.tasks.*": {"queue": QUEUE_FORECASTING},
        "alerts.tasks.*": {"queue": QUEUE_ALERTS},
    },
    # Every task is idempotent, so a worker that dies mid-task may safely see it again.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_soft_time_limit=60,
    task_time_limit=90,
    # Reconnect to the broker for as long as it is down: Celery's default gives up after 100
    # attempts (about 46 minutes of backoff), and the worker exits for good.
    broker_connection_retry=True,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    timezone="UTC",
)


def beat_schedule(*, sweep_period_s: float) -> dict[str, dict[str, Any]]:
    """Every beat entry, with why it exists. `expires` drops a tick that waited longer than its
    period: the next tick does the same work, so a backlog of stale ticks is pure waste."""
    return {
        # The liveness sweep. The queue is a hint and the database the truth: re-forecast active
        # runs whose debounced task was lost, and mark runs whose heartbeat stopped as stalled or
        # crashed. Its period is RUNCAST_SWEEP_PERIOD_S, which the sweep also reads to judge the
        # gaps in its own ticks; `expires` a little under it.
        "sweep-active-runs": {
            "task": "forecasting.tasks.sweep_active_runs",
            "schedule": sweep_period_s,
            "options": {"expires": max(sweep_period_s - 5.0, sweep_period_s / 2)},
        },
        # GPU activity of the hosts whose agents reported recently: episodes, attribution and the
        # gpu_unexplained flags (forecasting.gpu.check).
        "sweep-gpu-hosts": {
            "task": "forecasting.tasks.sweep_gpu_hosts",
            "schedule": 30.0,
            "options": {"expires": 25.0},
        },
        # Alerts' outbox sweep: dispatch flags and run endings whose enqueue was lost, re-enqueue
        # due delivery retries, and fail sends a dead worker abandoned. Every step is idempotent.
        "sweep-alerts": {
            "task": "alerts.tasks.sweep_alerts",
            "schedule": 60.0,
            "options": {"expires": 55},
        },
        # Retention (docs/deployment.md#retention): thin forecasts older than the full-history
        # window and drop the flags' old working rows; delete ingest-batch rows past the dedupe
        # window. Hourly so each pass is small; a pass stops at its time budget and the next one
        # continues.
        "thin-forecasts": {
            "task": "forecasting.tasks.forecasts_thin",
            "schedule": 3600.0,
            "options": {"expires": 3300},
        },
        "thin-ingest-batches": {
            "task": "tracker.tasks.batches_thin",
            "schedule": 3600.0,
            "options": {"expires": 3300},
        },
        # Runs deleted from the explorer (or MLflow's delete_run) longer ago than
        # RUNCAST_DELETED_RUN_KEEP_DAYS are deleted for good (tracker.bulk.runs_purge), their
        # rows cascading; sweep-artifacts then removes their files. Hourly: a run is purged
        # within the hour after its keep ends; with nothing to purge a pass is one index read.
        "purge-deleted-runs": {
            "task": "tracker.tasks.runs_purge",
            "schedule": 3600.0,
            "options": {"expires": 3300},
        },
        # Artifacts go with their run, logged model or project: their files are deleted by the
        # next pass after the row is (tracker/mlflow/artifacts.py).
        "sweep-artifacts": {
            "task": "tracker.mlflow.tasks.artifacts_sweep",
            "schedule": 3600.0,
            "options": {"expires": 3300},
        },
        # MLflow mirrors (docs/mlflow.md#mirror-an-mlflow-server): each enabled mirror's new
        # experiments, runs and points copied every 15 s, so they appear within 30 s. One task
        # per mirror, which claims it: a sync still running when the next tick comes is left to
        # finish, and the tick does nothing for that mirror. With no mirror a tick is one query.
        "sync-mlflow-mirrors": {
            "task": "tracker.mlflow.tasks.mirrors_sync",
            "schedule": 15.0,
            "options": {"expires": 12},
        },
        # Compaction (docs/deployment.md#compaction): merge the metric chunks whose batch rows
        # retention deleted (one point each at a batch a second) into chunks of 4,096 points,
        # ~20x less storage. Every 10 minutes so that retention's hourly work is merged in
        # small steps; a pass stops at its budget (4 min) and the next one continues, and a
        # pass with nothing to do is one query on a small partial index.
        "compact-metric-chunks": {
            "task": "tracker.tasks.chunks_compact",
            "schedule": 600.0,
            "options": {"expires": 540},
        },
        # The daily digest to project owners. Hourly, because "08:00" is per project timezone; a
        # Digest row per (project, local day) makes the other 23 ticks no-ops.
        "send-alert-digests": {
            "task": "alerts.tasks.send_digests",
            "schedule": 3600.0,
            "options": {"expires": 3300},
        },
    }


@app.on_after_configure.connect
def _install_beat_schedule(sender: Celery, **kwargs: Any) -> None:
    # When Celery first reads its configuration, not at import: config/__init__ imports this
    # module while a settings module that imports config.settings may still be loading.
    sender.conf.beat_schedule = beat_schedule(sweep_period_s=settings.RUNCAST_SWEEP_PERIOD_S)


app.autodiscover_tasks()
