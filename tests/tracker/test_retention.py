"""Ingest-batch retention: old batch rows go, their points, events and dedupe stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from forecasting import liveness
from tests.tracker.test_ingest_api import batch, create, series
from tracker import retention, selectors, services, tasks
from tracker.models import Event, IngestBatch, MetricChunk, Run, RunSegment

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def _ten_old_and_two_new(api, write_token):
    """Batches 1..10 received 10 days ago (with a checkpoint in 3), 11..12 just now."""
    create(api, write_token)
    for seq in range(1, 13):
        extra = {"events": [{"kind": "checkpoint", "step": 25}]} if seq == 3 else {}
        res = batch(api, write_token, seq=seq, metrics={"loss": series(seq * 10, 10)}, **extra)
        assert res.json()["duplicate"] is False
    IngestBatch.objects.filter(seq__lte=10).update(received_at=timezone.now() - 10 * DAY)
    return Run.objects.get()


def test_it_deletes_old_batch_rows_and_keeps_points_and_events(api, write_token):
    run = _ten_old_and_two_new(api, write_token)
    result = retention.batches_thin(now=timezone.now())
    assert (result.deleted, result.done) == (10, True)
    assert sorted(IngestBatch.objects.values_list("seq", flat=True)) == [11, 12]
    loss = selectors.series_load(run=run, key="loss")
    assert loss.steps.tolist() == list(range(10, 130))  # every point is still there
    assert MetricChunk.objects.filter(batch__isnull=True).count() == 10
    checkpoint = Event.objects.get(kind="checkpoint")
    assert checkpoint.step == 25 and checkpoint.batch is None
    assert RunSegment.objects.get(run=run).seq_floor == 10


def test_a_replayed_batch_still_dedupes_after_its_row_is_gone(api, write_token):
    run = _ten_old_and_two_new(api, write_token)
    retention.batches_thin(now=timezone.now())
    # A spool replaying seq 5 (deleted), seq 11 (kept), then a new batch.
    old = batch(api, write_token, seq=5, metrics={"loss": series(50, 10)})
    kept = batch(api, write_token, seq=11, metrics={"loss": series(110, 10)})
    new = batch(api, write_token, seq=13, metrics={"loss": series(130, 10)})
    assert old.json() == {"accepted": 0, "duplicate": True}
    assert kept.json() == {"accepted": 0, "duplicate": True}
    assert new.json() == {"accepted": 10, "duplicate": False}
    run.refresh_from_db()
    assert run.points_count == 130
    assert len(selectors.series_load(run=run, key="loss", resolve=False)) == 130
    assert not IngestBatch.objects.filter(seq=5).exists()  # no row came back either


def test_it_keeps_rows_inside_the_window_and_of_other_sessions_floors(api, write_token):
    _ten_old_and_two_new(api, write_token)
    # A second session of the same run (a resume) whose batches are all recent.
    create(api, write_token, session="s2")
    batch(api, write_token, session="s2", seq=1, metrics={"loss": series(0, 5)})
    with override_settings(RUNCAST_BATCH_KEEP_DAYS=30):
        assert retention.batches_thin(now=timezone.now()).deleted == 0
    # Shorter than a day is raised to a day: the new rows stay.
    with override_settings(RUNCAST_BATCH_KEEP_DAYS=0.01):
        assert retention.batches_thin(now=timezone.now()).deleted == 10
    assert IngestBatch.objects.count() == 3
    assert RunSegment.objects.get(session="s2").seq_floor is None


def test_liveness_still_reads_a_run_whose_old_rows_are_gone(api, write_token):
    run = _ten_old_and_two_new(api, write_token)
    IngestBatch.objects.update(received_at=timezone.now() - 10 * DAY)
    Run.objects.filter(pk=run.pk).update(last_seen_at=timezone.now() - 10 * DAY)
    retention.batches_thin(now=timezone.now())
    assert not IngestBatch.objects.exists()
    # Its chunks have no batch (so no received time) any more: they are left out, not an error.
    assert liveness.run_check_liveness(run_id=run.pk) == []


@pytest.mark.eager
def test_the_task_runs_twice_safely(api, write_token):
    _ten_old_and_two_new(api, write_token)
    tasks.batches_thin.delay()
    tasks.batches_thin.delay()
    assert IngestBatch.objects.count() == 2
    assert RunSegment.objects.get().seq_floor == 10


@pytest.mark.parametrize("one_statement", [True, False])
def test_an_mlflow_run_keeps_every_point_after_its_batch_rows_are_gone(
    client, write_token, monkeypatch, one_statement
):
    """The MLflow API keys a batch by a hash of its content, in no order: the floor a session's
    thinned rows leave must not refuse its later batches (it once dropped about a quarter of
    them, answering success), and a retried old request still stores nothing twice. On both
    write paths (tracker.services: one statement for one key, the general one)."""
    if not one_statement:
        monkeypatch.setattr(services, "_one_statement_applies", lambda **kwargs: False)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {write_token}"}

    def post(path, body):
        response = client.post(
            f"/api/2.0/mlflow/{path}", body, content_type="application/json", **headers
        )
        assert response.status_code == 200, response.content
        return response.json()

    run_id = post("runs/create", {"experiment_id": "0"})["run"]["info"]["run_id"]

    def point(step):
        return {"run_id": run_id, "key": "loss", "value": 1.0, "timestamp": step, "step": step}

    for step in range(5):
        post("runs/log-metric", point(step))
    IngestBatch.objects.update(received_at=timezone.now() - 30 * DAY)
    assert retention.batches_thin(now=timezone.now()).deleted == 5
    assert RunSegment.objects.get().seq_floor is not None
    for step in range(5, 45):
        post("runs/log-metric", point(step))
    post("runs/log-metric", point(2))  # retried after its row was thinned
    post("runs/log-batch", {"run_id": run_id, "metrics": [point(3), point(45)]})
    run = Run.objects.get(public_id=run_id)
    assert run.points_count == 46
    loss = selectors.series_load(run=run, key="loss", resolve=False)
    assert sorted(loss.steps.tolist()) == list(range(46))
