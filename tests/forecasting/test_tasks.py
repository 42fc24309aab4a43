"""Celery tasks: idempotent when run twice, and carried by the real broker to a real worker."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from celery.signals import after_task_publish
from django.conf import settings
from django.core.cache import cache
from django.test import override_settings
from django.utils import timezone

from config.celery import QUEUE_FORECASTING, app
from config.settings.base import cache_config
from forecasting import tasks
from forecasting.models import Flag, Forecast
from tests import broker
from tests.redis_server import free_port
from tracker import pacing
from tracker.services import SeriesIn, batch_ingest, from_epoch, run_start


def make_run(project, n=3000):
    run = run_start(
        project=project,
        public_id="r1",
        session="s",
        started_at=from_epoch(1.76e9),
        fields={"total_steps": 10_000},
    ).run
    now = timezone.now().timestamp()
    steps = np.arange(n)
    loss = 2.0 + 8.0 * (steps + 10.0) ** -0.3
    loss[-5:] = np.nan
    batch_ingest(
        run=run,
        session="s",
        seq=1,
        events=[],
        heartbeat=None,
        series=[SeriesIn("loss", steps, loss, now - (n - steps).astype(float))],
    )
    return run


@pytest.mark.django_db
def test_forecast_task_run_twice_changes_nothing(project):
    run = make_run(project)
    # A redelivered task runs again later: it may record that it looked once more (a
    # ConditionReading, the flags' working history, keyed by the computation's time), and
    # nothing else.
    forecasts = Forecast.objects.all()
    tasks.forecast_run(run.pk)
    before = (forecasts.count(), Flag.objects.count())
    tasks.forecast_run(run.pk)
    assert (forecasts.count(), Flag.objects.count()) == before
    assert Flag.objects.filter(kind="nan").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "runs",
    [pytest.param(True, marks=pytest.mark.eager, id="eager"), pytest.param(False, id="sent")],
)
def test_a_sent_task_runs_in_the_test_only_where_it_is_marked_eager(project, runs):
    # Elsewhere it waits in the broker, as on a server with no worker (tests/conftest.py).
    run = make_run(project)
    tasks.forecast_run.delay(run.pk)
    assert Flag.objects.filter(run=run, kind="nan").exists() is runs


@pytest.mark.django_db
def test_it_debounces_forecast_requests(project, monkeypatch):
    run = make_run(project, n=10)
    calls = []
    monkeypatch.setattr("forecasting.tasks.forecast_run.apply_async", lambda **kw: calls.append(kw))
    cache.clear()
    assert tasks.forecast_enqueue(run_id=run.pk) is True
    assert tasks.forecast_enqueue(run_id=run.pk) is False
    assert len(calls) == 1 and calls[0]["countdown"] == tasks.FORECAST_DEBOUNCE_S


@pytest.mark.django_db
@override_settings(RUNCAST_FORECASTS_PER_S=2.0, RUNCAST_FORECAST_INTERVAL_MAX_S=30.0)
def test_many_live_runs_are_forecast_less_often_up_to_the_maximum(project, monkeypatch):
    calls = []
    monkeypatch.setattr("forecasting.tasks.forecast_run.apply_async", lambda **kw: calls.append(kw))
    cache.clear()
    pacing.forget()
    runs = [make_run_named(project, f"r{i}") for i in range(41)]
    try:
        assert tasks.forecast_enqueue(run_id=runs[0].pk) is True
        # 41 live runs at 2 forecasts a second: one each 21 s (rounded up), not every 15 s.
        assert calls[-1]["countdown"] == 21.0
    finally:
        pacing.forget()
    assert tasks.forecast_interval(live=10) == tasks.FORECAST_DEBOUNCE_S  # fits the budget
    assert tasks.forecast_interval(live=1000) == 30.0  # never past the freshness promised
    with override_settings(RUNCAST_FORECASTS_PER_S=0):
        assert tasks.forecast_interval(live=1000) == tasks.FORECAST_DEBOUNCE_S  # pacing off


def make_run_named(project, public_id):
    return run_start(
        project=project,
        public_id=public_id,
        session="s",
        started_at=timezone.now(),
        fields={"total_steps": 10_000},
    ).run


@pytest.mark.django_db
def test_sweep_task_run_twice_changes_nothing(project):
    run = make_run(project)
    forecasts = Forecast.objects.all()  # as above
    tasks.sweep_active_runs()
    before = (forecasts.count(), Flag.objects.count(), run.status)
    tasks.sweep_active_runs()
    run.refresh_from_db()
    assert (forecasts.count(), Flag.objects.count(), run.status) == before


@pytest.fixture
def real_worker():
    """A worker thread consuming the forecasting queue through the configured broker."""
    from celery.contrib.testing.worker import start_worker
    from celery.signals import task_postrun
    from django.db import connections

    def close_worker_connections(**kwargs: object) -> None:
        # A real worker's Django fixup does this; the in-thread test worker does not, and an
        # open connection in its thread would lock the test database at teardown.
        connections.close_all()

    # What an aborted earlier session left in the broker (Redis outlives a run) is not ours.
    broker.purge()
    task_postrun.connect(close_worker_connections, weak=False)
    try:
        with start_worker(
            app,
            pool="solo",
            perform_ping_check=False,
            queues=[QUEUE_FORECASTING],
            shutdown_timeout=10,
        ) as worker:
            yield worker
    finally:
        task_postrun.disconnect(close_worker_connections)


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_takes_the_task_from_the_broker(project, real_worker):
    """Through CELERY_BROKER_URL (Redis in CI, the filesystem broker locally), not eagerly."""
    run = make_run(project)
    tasks.forecast_run.delay(run.pk)
    # Generous: a loaded 2-core machine may take a while to start the worker thread.
    deadline = time.monotonic() + 90
    # The flags are the task's last write.
    while not Flag.objects.filter(run=run, kind="nan").exists():
        assert time.monotonic() < deadline, f"no worker ran it via {settings.CELERY_BROKER_URL}"
        time.sleep(0.1)
    assert Forecast.objects.filter(run=run, kind="eta").exists()


@pytest.mark.django_db
def test_ingest_enqueues_one_forecast_per_interval_while_the_cache_is_down(
    api, write_token, settings, caplog, django_capture_on_commit_callbacks
):
    """The debounce marker's cache is Redis in production; while it is down, each process
    debounces on its own (config/cache.py) instead of every batch's enqueue failing."""
    settings.CACHES = {"default": cache_config(f"redis://127.0.0.1:{free_port()}/1")}
    sent = []

    def note(sender=None, **kwargs):
        sent.append(sender)

    body = {"id": "r1", "session": "s", "name": "pretrain", "total_steps": 1000}
    assert api("POST", "/runs", write_token, body).status_code == 201
    after_task_publish.connect(note, weak=False)
    try:
        with caplog.at_level(logging.WARNING), django_capture_on_commit_callbacks(execute=True):
            for seq in (1, 2, 3):
                steps = list(range(seq * 10, seq * 10 + 10))
                loss = {"steps": steps, "values": [1.0] * 10, "times": [1.7e9 + s for s in steps]}
                res = api(
                    "POST",
                    "/runs/r1/batches",
                    write_token,
                    {"session": "s", "seq": seq, "metrics": {"loss": loss}},
                )
                assert res.status_code == 200, res.content
    finally:
        after_task_publish.disconnect(note)
    assert sent == ["forecasting.tasks.forecast_run"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
