"""A one-key batch is stored in one PostgreSQL statement (tracker.services._one_key_ingest): the
same rows as the general path, exactly once, and forecasts enqueued as before."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tracker import services
from tracker.models import IngestBatch, LatestMetric, MetricChunk, Project, Run, RunSegment
from tracker.signals import run_ingested

pytestmark = pytest.mark.django_db

# Every column but the row's own ids: a column added to MetricChunk is compared too.
CHUNK_FIELDS = tuple(
    f.attname
    for f in MetricChunk._meta.concrete_fields
    if f.attname not in ("id", "run_id", "batch_id")
)


def _series(key: str, steps: list[int], values: list[float], t0: float = 1.0e9) -> Any:
    return services.SeriesIn(
        key=key,
        steps=np.array(steps, dtype=np.int64),
        values=np.array(values, dtype=np.float64),
        times=t0 + np.arange(len(steps), dtype=np.float64),
    )


def _run(project: Project, public_id: str) -> Run:
    started = services.run_start(
        project=project,
        public_id=public_id,
        session="s1",
        started_at=timezone.now(),
        fields={"name": public_id},
    )
    return started.run


@pytest.fixture
def notified() -> Iterator[list[int]]:
    """The runs `run_ingested` was sent for, in order (after commit: run the callbacks)."""
    seen: list[int] = []

    def receiver(sender: Any, run_id: int, **kwargs: Any) -> None:
        seen.append(run_id)

    run_ingested.connect(receiver, weak=False, dispatch_uid="one-key-test")
    yield seen
    run_ingested.disconnect(dispatch_uid="one-key-test")


# Forward, repeated, backwards (the latest keeps the higher step), NaN and Inf, a retried
# (session, seq), a batch of a new session (no segment yet: a resume), then the old session.
SCRIPT: list[tuple[str, int, Any]] = [
    ("s1", 1, _series("loss", [0], [2.0])),
    ("s1", 2, _series("loss", [1, 2, 3], [1.5, float("nan"), 1.2])),
    ("s1", 2, _series("loss", [1, 2, 3], [1.5, float("nan"), 1.2])),
    ("s1", 3, _series("loss", [1], [9.0])),
    ("s1", 4, _series("lr", [3], [float("inf")])),
    ("s2", 1, _series("loss", [2], [1.4])),
    ("s2", 2, _series("loss", [3, 4], [1.3, 1.1])),
    ("s1", 5, _series("loss", [5], [1.0])),
]


def _replay(run: Run) -> list[services.IngestResult]:
    return [
        services.batch_ingest(
            run=run,
            session=session,
            seq=seq,
            series=[series],
            events=[],
            heartbeat=datetime(2026, 1, 1, tzinfo=UTC),
        )
        for session, seq, series in SCRIPT
    ]


def _state(run: Run) -> dict[str, Any]:
    run.refresh_from_db()
    return {
        "chunks": [
            tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
            for row in MetricChunk.objects.filter(run=run).order_by("id").values_list(*CHUNK_FIELDS)
        ],
        "latest": sorted(
            LatestMetric.objects.filter(run=run).values_list(
                "key", "value", "is_nan", "step", "timestamp_ms"
            )
        ),
        "segments": list(
            RunSegment.objects.filter(run=run)
            .order_by("number")
            .values_list("number", "session", "first_step")
        ),
        "batches": sorted(
            IngestBatch.objects.filter(run=run).values_list("session", "seq", "points")
        ),
        "run": (run.last_step, run.points_count, run.current_segment, run.status),
    }


def test_it_stores_what_the_general_path_stores(
    project: Project,
    monkeypatch: pytest.MonkeyPatch,
    notified: list[int],
    django_capture_on_commit_callbacks: Any,
) -> None:
    fast = _run(project, "fast")
    with django_capture_on_commit_callbacks(execute=True):
        fast_results = _replay(fast)
    assert notified == [fast.pk] * 7  # every accepted batch, not the retry
    monkeypatch.setattr(services, "_one_statement_applies", lambda **kwargs: False)
    general = _run(project, "general")
    general_results = _replay(general)
    assert fast_results == general_results
    assert [r.duplicate for r in fast_results] == [
        False,
        False,
        True,
        False,
        False,
        False,
        False,
        False,
    ]
    assert _state(fast) == _state(general)
    assert _state(fast)["run"] == (4, 10, 2, "running")


def test_it_writes_a_batch_in_one_statement_and_a_retry_writes_nothing(
    project: Project, notified: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    run = _run(project, "r")
    points = [_series("loss", [0], [1.0])]
    with (
        django_capture_on_commit_callbacks(execute=True),
        CaptureQueriesContext(connection) as queries,
    ):
        result = services.batch_ingest(
            run=run, session="s1", seq=1, series=points, events=[], heartbeat=None
        )
    assert result == services.IngestResult(accepted=1, duplicate=False)
    assert len(queries.captured_queries) == 1
    with django_capture_on_commit_callbacks(execute=True):
        again = services.batch_ingest(
            run=run, session="s1", seq=1, series=points, events=[], heartbeat=None
        )
    assert again == services.IngestResult(accepted=0, duplicate=True)
    assert MetricChunk.objects.filter(run=run).count() == 1
    assert notified == [run.pk]


def test_a_batch_under_the_retention_floor_writes_nothing(project: Project) -> None:
    run = _run(project, "r")
    RunSegment.objects.filter(run=run).update(seq_floor=10)
    result = services.batch_ingest(
        run=run,
        session="s1",
        seq=7,
        series=[_series("loss", [0], [1.0])],
        events=[],
        heartbeat=None,
    )
    assert result == services.IngestResult(accepted=0, duplicate=True)
    assert not IngestBatch.objects.filter(run=run).exists()
    assert not MetricChunk.objects.filter(run=run).exists()
    assert not LatestMetric.objects.filter(run=run).exists()
    run.refresh_from_db()
    assert (run.points_count, run.last_step) == (0, None)


@pytest.mark.parametrize(
    ("status", "ended", "after"),
    [("stalled", False, "running"), ("crashed", False, "running"), ("crashed", True, "crashed")],
)
def test_a_run_heard_again_is_running_unless_its_client_ended_it(
    project: Project, status: str, ended: bool, after: str
) -> None:
    run = _run(project, "r")
    Run.objects.filter(pk=run.pk).update(status=status, ended_at=timezone.now() if ended else None)
    services.batch_ingest(
        run=run,
        session="s1",
        seq=1,
        series=[_series("loss", [0], [1.0])],
        events=[],
        heartbeat=None,
    )
    run.refresh_from_db()
    assert run.status == after


def test_a_log_metric_request_costs_three_queries_and_keeps_a_point_once(
    client: Any, write_token: str
) -> None:
    """Token, run, the one statement: what made a synchronous log_metric cost 4x an MLflow
    server's was eleven (bench/mlflow_throughput.py)."""
    headers = {"HTTP_AUTHORIZATION": f"Bearer {write_token}"}

    def post(path: str, body: dict[str, Any]) -> Any:
        response = client.post(
            f"/api/2.0/mlflow/{path}", body, content_type="application/json", **headers
        )
        assert response.status_code == 200, response.content
        return response.json()

    run_id = post("runs/create", {"experiment_id": "0"})["run"]["info"]["run_id"]
    point = {"run_id": run_id, "key": "loss", "value": 0.5, "timestamp": 1_000, "step": 0}
    post("runs/log-metric", point)
    with CaptureQueriesContext(connection) as queries:
        post("runs/log-metric", {**point, "value": 0.4, "timestamp": 2_000, "step": 1})
    assert len(queries.captured_queries) == 3
    post("runs/log-metric", point)  # the same point again: MLflow keeps it once
    post("runs/log-batch", {"run_id": run_id, "metrics": [point, {**point, "step": 2}]})
    run = Run.objects.get(public_id=run_id)
    assert (run.points_count, run.last_step) == (3, 2)
    latest = LatestMetric.objects.get(run=run, key="loss")
    assert (latest.step, latest.value) == (2, 0.5)
