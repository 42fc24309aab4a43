"""The forecasting beat sweeps, each unit on its own: one host or run whose data makes its check
raise is logged with its id, every other one is still checked, and the next sweep retries it."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.utils import timezone

from forecasting import tasks
from forecasting.models import Flag, ServerClock
from tracker import services
from tracker.gpu import services as gpu_store
from tracker.models import HostBatch, HostProcess, IngestBatch, MetricChunk, Project, Run

pytestmark = pytest.mark.django_db

SPAN = 3600


def _stepping_run(project: Project, run_id: str, *, t0: float, until: float, boot: str) -> Run:
    """A run on the host with kernel `boot`, stepping every 2 s from t0 to t0 + until."""
    started = datetime.fromtimestamp(t0, tz=UTC)
    run = services.run_start(
        project=project, public_id=run_id, session="s1", started_at=started, fields={}
    ).run
    gpu_store.run_process_record(run=run, session="s1", host=boot, info={"key": [boot, 77, 9000]})
    times = np.arange(t0, t0 + until, 2.0)
    steps = np.arange(times.size, dtype=np.int64)
    series = [services.SeriesIn("loss", steps, np.linspace(3, 2, times.size), times)]
    services.batch_ingest(run=run, session="s1", seq=1, series=series, events=[], heartbeat=None)
    return run


def _busy_host(project: Project, name: str, *, t0: float) -> Any:
    """A host whose four GPUs sat at 98% from t0 for SPAN seconds, all of it the run's pid."""
    host, _ = gpu_store.host_register(project=project, name=name, boot_id=name, gpus=[])
    for k in range(SPAN // 60):
        t = t0 + k * 60 + np.arange(60, dtype=float)
        series = {f"gpu/{g}/util": (t, np.full(60, 98.0)) for g in range(4)}
        series.update({f"gpu/{g}/proc/4242/sm": (t, np.full(60, 97.0)) for g in range(4)})
        gpu_store.host_batch_ingest(host=host, session="a", seq=k, series=series, processes=[])
    HostProcess.objects.create(host=host, pid=4242, start_ticks=9000, ns_pid=77, first_seen=t0)
    return host


def _sweep_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "runcast.sweeps"]


def test_one_hosts_broken_data_does_not_stop_the_gpu_checks_of_the_others(
    project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    # Two hosts, each busy for the last hour under a run whose step froze 40 min ago: a hang.
    # The first one's stored telemetry cannot be read (a batch whose blob is not zlib data).
    t0 = float(int(time.time())) - SPAN
    broken = _busy_host(project, "n1", t0=t0)
    HostBatch.objects.filter(host=broken, seq=SPAN // 60 - 1).update(data=b"not zlib")
    healthy = _busy_host(project, "n2", t0=t0)
    run_on_broken = _stepping_run(project, "on-n1", t0=t0, until=1200, boot="n1")
    run_on_healthy = _stepping_run(project, "on-n2", t0=t0, until=1200, boot="n2")

    tasks.sweep_gpu_hosts()

    assert Flag.objects.filter(run=run_on_healthy, kind=Flag.Kind.HANG).count() == 1
    assert not Flag.objects.filter(run=run_on_broken, kind=Flag.Kind.HANG).exists()
    (failure,) = _sweep_failures(caplog)
    assert failure.startswith(f"sweep: GPU check of host {broken.pk} failed;")
    assert healthy.pk != broken.pk

    # Repaired (its batch dropped), the host is checked again by the next sweep.
    HostBatch.objects.filter(host=broken, data=b"not zlib").delete()
    tasks.sweep_gpu_hosts()
    assert Flag.objects.filter(run=run_on_broken, kind=Flag.Kind.HANG).count() == 1


def _dead_run(project: Project, run_id: str) -> Run:
    """A run that logged 20 batches, one a second, and went silent an hour ago."""
    run = services.run_start(
        project=project,
        public_id=run_id,
        session="s1",
        started_at=timezone.now() - timedelta(hours=2),
        fields={},
    ).run
    now = timezone.now().timestamp()
    for i in range(20):
        steps = np.arange(i * 10, (i + 1) * 10)
        times = now - 3600 - 200 + steps.astype(float)
        series = [services.SeriesIn("loss", steps, 2.0 + 8.0 * (steps + 10.0) ** -0.3, times)]
        services.batch_ingest(
            run=run, session="s1", seq=i + 1, series=series, events=[], heartbeat=None
        )
    died = timezone.now() - timedelta(hours=1)
    for k, batch in enumerate(IngestBatch.objects.filter(run=run).order_by("seq")):
        IngestBatch.objects.filter(pk=batch.pk).update(received_at=died - timedelta(seconds=20 - k))
    return run


def test_one_runs_broken_data_does_not_stop_the_liveness_of_the_others(
    project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    # The server has been listening for hours: the silence is the runs'.
    ServerClock.objects.create(
        pk=1,
        listening_since=timezone.now() - timedelta(hours=3),
        last_tick_at=timezone.now() - timedelta(seconds=30),
    )
    broken = _dead_run(project, "broken")
    # Its last loss chunk cannot be read (7 bytes of float64 values): the crash's look at its
    # final data raises.
    last = MetricChunk.objects.filter(run=broken).latest("id")
    MetricChunk.objects.filter(pk=last.pk).update(values=b"\x00" * 7)
    dead = _dead_run(project, "dead")

    tasks.sweep_active_runs()

    assert Run.objects.get(pk=dead.pk).status == Run.Status.CRASHED
    assert Flag.objects.get(run=dead, kind=Flag.Kind.STALLED).state == Flag.State.RAISED
    (failure,) = _sweep_failures(caplog)
    assert failure.startswith(f"sweep: liveness of run {broken.pk} failed;")
    # Nothing of the failed check was kept (not "crashed" without its flag, which no later
    # sweep would look at again: it checks active runs only) ...
    assert Run.objects.get(pk=broken.pk).status == Run.Status.RUNNING
    assert not Flag.objects.filter(run=broken).exists()

    # ... so once its data reads again, the next sweep closes it like the other.
    MetricChunk.objects.filter(pk=last.pk).update(values=last.values)
    tasks.sweep_active_runs()
    assert Run.objects.get(pk=broken.pk).status == Run.Status.CRASHED
    assert Flag.objects.get(run=broken, kind=Flag.Kind.STALLED).state == Flag.State.RAISED
