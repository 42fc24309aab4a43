"""Compaction of old metric chunks (tracker/compaction.py): every reader reads the same points in
the same order after it, a replayed batch is still a duplicate, and neither an abort half-way,
concurrent ingest nor a second sweep loses or doubles a point."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from config.celery import beat_schedule
from tests.tracker.test_ingest_api import batch, create, series
from tracker import compaction, retention, selectors, services, tasks
from tracker.mlflow import selectors as mlflow_selectors
from tracker.models import IngestBatch, MetricChunk, Project, Run
from tracker.series import rollup, unpack_floats, unpack_steps

pytestmark = pytest.mark.django_db

T0 = 1.7e9
# Small units so a few dozen points make several of them.
TARGET, BELOW = 8, 4


def _ingest(run: Run, session: str, seq: int, key_points: dict[str, tuple[list, list]]) -> None:
    rng = np.random.default_rng(seq)
    series_in = []
    for key, (steps, values) in key_points.items():
        s = np.array(steps, dtype=np.int64)
        # Jittered times, as a real client's clock gives them.
        times = T0 + s + rng.uniform(0, 0.9, s.size)
        series_in.append(services.SeriesIn(key, s, np.array(values, dtype=float), times))
    result = services.batch_ingest(
        run=run, session=session, seq=seq, series=series_in, events=[], heartbeat=None
    )
    assert not result.duplicate


def _start(project: Project, session: str) -> Run:
    return services.run_start(
        project=project,
        public_id="r",
        session=session,
        started_at=services.from_epoch(T0),
        fields={"total_steps": 100},
    ).run


def _history(project: Project) -> Run:
    """Segment 1: one-point batches of loss and lr for steps 0..29 (NaN, +Inf, -Inf and -0.0
    among them), a 10-point batch, step 12 logged again; segment 2 (a resume from step 20):
    one-point batches to step 44. All but the last 4 batches are past the dedupe window and
    retention has deleted their rows."""
    run = _start(project, "s1")
    special = {5: float("nan"), 6: float("inf"), 7: float("-inf"), 8: -0.0}
    seq = 0
    for step in range(30):
        seq += 1
        loss = special.get(step, 3.0 - step / 100)
        _ingest(run, "s1", seq, {"loss": ([step], [loss]), "lr": ([step], [1e-3])})
    _ingest(run, "s1", seq + 1, {"loss": (list(range(30, 40)), list(np.linspace(2.7, 2.6, 10)))})
    _ingest(run, "s1", seq + 2, {"loss": ([12], [9.5])})  # a step logged twice
    run = _start(project, "s2")
    for seq, step in enumerate(range(20, 45), start=1):
        _ingest(run, "s2", seq, {"loss": ([step], [2.9 - step / 100]), "lr": ([step], [5e-4])})
    old = timezone.now() - timedelta(days=10)
    IngestBatch.objects.exclude(session="s2", seq__gt=21).update(received_at=old)
    assert retention.batches_thin(now=timezone.now()).done
    return Run.objects.get(pk=run.pk)


def _bytes(a: np.ndarray) -> bytes:
    return a.tobytes()  # compares NaN, -0.0 and Inf exactly


def _reads(run: Run) -> dict[str, Any]:
    """What every reader of points answers for the run."""
    out: dict[str, Any] = {"keys": selectors.series_keys(run=run)}
    for key in out["keys"]:
        for resolve in (True, False):
            s = selectors.series_load(run=run, key=key, resolve=resolve)
            out[f"{key} load {resolve}"] = [
                _bytes(a) for a in (s.steps, s.values, s.times, s.segments)
            ]
        out[f"{key} last"] = selectors.series_last(run=run, key=key, points=5)
        view = selectors.series_view(run=run, key=key, buckets=1000)
        assert view.source == "raw"
        out[f"{key} view"] = [view.points] + [
            _bytes(a) for a in (view.x, view.mean, view.lo, view.hi, view.nonfinite_steps)
        ]
        zoom = selectors.series_view(run=run, key=key, buckets=1000, x0=10, x1=25)
        out[f"{key} zoom"] = [_bytes(a) for a in (zoom.x, zoom.lo, zoom.hi, zoom.nonfinite_steps)]
        out[f"{key} mlflow history"] = mlflow_selectors.metric_history(run=run, key=key)
        out[f"{key} mlflow sampled"] = mlflow_selectors.metric_history_sampled(
            run=run, key=key, start=None, end=None, max_results=20
        )
    speed = selectors.throughput_view(run=run, buckets=20)
    out["throughput"] = [_bytes(a) for a in (speed.x, speed.rate, speed.lo, speed.hi)]
    return out


def _compact() -> compaction.CompactResult:
    return compaction.chunks_compact(target=TARGET, below=BELOW)


def test_every_reader_reads_a_compacted_run_as_before(project):
    run = _history(project)
    before, rows_before = _reads(run), MetricChunk.objects.count()

    result = _compact()

    assert result.done and result.failed == 0 and result.merged > 0
    assert MetricChunk.objects.count() == rows_before - result.merged
    assert _reads(run) == before
    # Nothing is merged across segments or over the chunks whose batch rows remain.
    assert set(MetricChunk.objects.values_list("segment", flat=True)) == {1, 2}
    assert MetricChunk.objects.filter(batch__isnull=False).count() == 4 * 2
    for chunk in MetricChunk.objects.all():
        steps, values = unpack_steps(bytes(chunk.steps)), unpack_floats(bytes(chunk.values))
        assert chunk.n == steps.size <= max(TARGET, 10)  # the 10-point batch stays as it came
        assert (chunk.min_step, chunk.max_step) == (steps.min(), steps.max())
        assert (chunk.first_step, chunk.last_step) == (steps[0], steps[-1])
        assert chunk.nonfinite == int((~np.isfinite(values)).sum())
        assert bytes(chunk.rollup) == rollup(steps, values)  # rebuilt, not the first chunk's


def test_a_second_sweep_finds_nothing_to_do_in_one_query(project, django_assert_num_queries):
    _history(project)
    _compact()
    with django_assert_num_queries(1):
        again = _compact()
    assert (again.units, again.merged, again.done) == (0, 0, True)


def test_the_chart_rollups_are_those_of_the_compacted_points(project):
    run = _history(project)
    _compact()
    # Few buckets for many points: the chart reads the chunks' rollups, not their points.
    view = selectors.series_view(run=run, key="lr", buckets=1, x0=0, x1=44)
    assert view.source == "rollup"
    assert (view.lo.tolist(), view.hi.tolist()) == ([5e-4], [1e-3])


def test_a_replayed_batch_is_still_a_duplicate_after_compaction(api, write_token):
    create(api, write_token)
    for seq in range(1, 13):
        batch(api, write_token, seq=seq, metrics={"loss": series(seq, 1)})
    IngestBatch.objects.filter(seq__lte=10).update(received_at=timezone.now() - timedelta(days=10))
    retention.batches_thin(now=timezone.now())
    assert _compact().merged > 0

    for seq in (3, 11):  # its row deleted, its row kept
        replay = batch(api, write_token, seq=seq, metrics={"loss": series(seq, 1)})
        assert replay.json() == {"accepted": 0, "duplicate": True}
    run = Run.objects.get()
    assert run.points_count == 12
    assert selectors.series_load(run=run, key="loss").steps.tolist() == list(range(1, 13))


@pytest.mark.eager
def test_the_task_runs_twice_and_beat_schedules_it(project):
    run = _history(project)
    before = _reads(run)
    tasks.chunks_compact.delay()
    rows = MetricChunk.objects.count()
    tasks.chunks_compact.delay()
    assert MetricChunk.objects.count() == rows
    assert _reads(run) == before
    entry = beat_schedule(sweep_period_s=60.0)["compact-metric-chunks"]
    assert entry["task"] == "tracker.tasks.chunks_compact"
    assert entry["options"]["expires"] < entry["schedule"]


def test_the_work_list_index_matches_the_compaction_threshold():
    (index,) = [i for i in MetricChunk._meta.indexes if i.name == "chunk_compactable_idx"]
    assert dict(index.condition.children) == {
        "batch__isnull": True,
        "n__lt": MetricChunk.COMPACT_BELOW,
    }


def test_plan_keeps_units_inside_runs_of_old_small_chunks():
    chunks = [
        (1, 1, True),
        (2, 1, True),
        (3, 1, False),  # its batch row is still there: never merged over
        (4, 3, True),
        (5, 3, True),
        (6, 3, True),  # 3 + 3 + 3 > 8: a new unit
        (7, 5, True),  # not small
        (8, 2, True),
        (9, 1, True),
    ]
    units = list(compaction.plan(iter(chunks), TARGET, BELOW))
    assert units == [[(1, 1), (2, 1)], [(4, 3), (5, 3)], [(8, 2), (9, 1)]]


# --- aborts and concurrency: real transactions on PostgreSQL ------------------------------------


def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers: no concurrent transaction to get wrong")


@pytest.mark.django_db(transaction=True)
def test_a_unit_killed_half_way_loses_and_doubles_nothing(project, monkeypatch):
    _postgres_only()
    run = _history(project)
    before, rows_before = _reads(run), MetricChunk.objects.count()
    real_delete, calls = compaction.chunks_delete, []

    def killed_after_the_merged_row_was_written(*, ids: list[int]) -> int:
        # The second unit dies between its UPDATE and its DELETE: the server ends the session
        # as it would for a worker killed there, and rolls back the open transaction.
        calls.append(ids)
        if len(calls) == 2:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return real_delete(ids=ids)

    monkeypatch.setattr(compaction, "chunks_delete", killed_after_the_merged_row_was_written)
    first = _compact()
    connections.close_all()

    # The sweep logged the series it could not finish; the killed unit's chunks are all there
    # and nothing it wrote stayed (its merged row would double their points).
    assert first.failed >= 1
    assert MetricChunk.objects.filter(id__in=calls[1]).count() == len(calls[1])
    assert MetricChunk.objects.count() < rows_before
    assert sum(MetricChunk.objects.values_list("n", flat=True)) == run.points_count
    assert _reads(run) == before
    monkeypatch.setattr(compaction, "chunks_delete", real_delete)
    assert _compact().failed == 0
    assert _reads(run) == before
    assert sum(MetricChunk.objects.values_list("n", flat=True)) == run.points_count


@pytest.mark.django_db(transaction=True)
def test_concurrent_ingest_and_sweeps_lose_and_double_nothing(project):
    """Two sweeps and an ingesting trainer, each on its own connection, on one run."""
    _postgres_only()
    run = _history(project)
    before = _reads(run)
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def guarded(work: Any) -> Any:
        def body() -> None:
            try:
                start.wait(10)
                work()
            except BaseException as e:  # reported by the assertion below
                errors.append(e)
            finally:
                connections.close_all()

        return body

    def sweep() -> None:
        for _ in range(3):
            assert _compact().failed == 0

    def trainer() -> None:
        live = Run.objects.get(pk=run.pk)
        for seq, step in enumerate(range(45, 85), start=26):
            _ingest(live, "s2", seq, {"loss": ([step], [2.0]), "lr": ([step], [5e-4])})
            if step % 10 == 0:
                # An old batch row expires meanwhile: retention releases more chunks.
                with transaction.atomic():
                    IngestBatch.objects.filter(session="s2", seq=seq - 5).update(
                        received_at=timezone.now() - timedelta(days=10)
                    )
                retention.batches_thin(now=timezone.now())

    threads = [threading.Thread(target=guarded(w)) for w in (sweep, sweep, trainer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    run.refresh_from_db()
    assert run.points_count == 30 * 2 + 11 + 25 * 2 + 40 * 2
    assert sum(MetricChunk.objects.values_list("n", flat=True)) == run.points_count
    assert _compact().failed == 0
    stored = np.frombuffer(before["loss load False"][0], dtype=np.int64)
    loss = selectors.series_load(run=run, key="loss", resolve=False)
    assert _bytes(loss.steps) == _bytes(np.concatenate([stored, np.arange(45, 85)]))
    plotted = np.concatenate([np.sort(np.append(np.arange(0, 20), 12)), np.arange(20, 85)])
    assert _reads(run)["loss load True"][0] == _bytes(plotted)
