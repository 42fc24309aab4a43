"""The hard `hang` rule on the server: busy GPUs, a run whose step has not moved for many usual
step times (BLOOM-176B's eval deadlock) -> one `hang` flag; a run still stepping -> none."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from forecasting.gpu import check as gpu_check
from forecasting.models import Flag
from tracker import services
from tracker.gpu import services as store
from tracker.models import HostProcess, Project, Run

pytestmark = pytest.mark.django_db

BOOT = "boot-hang-test"
T0 = 1_800_000_000.0
SPAN = 3600


def setup_run(project: Project, steps_until: float) -> Run:
    started = datetime.fromtimestamp(T0, tz=UTC)
    run = services.run_start(
        project=project, public_id="bloom", session="s1", started_at=started, fields={}
    ).run
    store.run_process_record(run=run, session="s1", host="n1", info={"key": [BOOT, 77, 9000]})
    times = np.arange(T0, T0 + steps_until, 2.0)
    services.batch_ingest(
        run=run,
        session="s1",
        seq=1,
        series=[
            services.SeriesIn(
                key="loss",
                steps=np.arange(times.size, dtype=np.int64),
                values=np.linspace(3, 2, times.size),
                times=times,
            )
        ],
        events=[],
        heartbeat=None,
    )
    return run


def busy_host(project: Project) -> Any:
    host, _ = store.host_register(project=project, name="n1", boot_id=BOOT, gpus=[])
    for k in range(SPAN // 60):
        t = T0 + k * 60 + np.arange(60, dtype=float)
        series = {f"gpu/{g}/util": (t, np.full(60, 98.0)) for g in range(4)}
        series.update({f"gpu/{g}/proc/4242/sm": (t, np.full(60, 97.0)) for g in range(4)})
        store.host_batch_ingest(host=host, session="a", seq=k, series=series, processes=[])
    HostProcess.objects.create(host=host, pid=4242, start_ticks=9000, ns_pid=77, first_seen=T0)
    return host


def test_busy_gpus_and_a_frozen_step_raise_one_hang(project: Project) -> None:
    run = setup_run(project, steps_until=1200)  # steps every 2 s, then nothing for 40 min
    host = busy_host(project)
    gpu_check.gpu_check_host(host_id=host.pk, now=T0 + SPAN)
    gpu_check.gpu_check_host(host_id=host.pk, now=T0 + SPAN)  # the same stretch: no repeat
    hangs = Flag.objects.filter(run=run, kind=Flag.Kind.HANG)
    assert hangs.count() == 1
    text = hangs.get().explanation
    assert "GPUs 0\u20133 on n1 busy at 98%" in text and "no progress" in text


def test_a_run_still_stepping_is_no_hang(project: Project) -> None:
    run = setup_run(project, steps_until=SPAN)
    host = busy_host(project)
    gpu_check.gpu_check_host(host_id=host.pk, now=T0 + SPAN)
    assert not Flag.objects.filter(run=run, kind=Flag.Kind.HANG).exists()


def test_a_run_that_started_after_the_agent_stopped_is_no_hang(project: Project) -> None:
    # The agent's last sample is at T0 + SPAN; the job started five minutes later and has been
    # stepping since. No sample lies in its time: nothing to judge (the check raised "zero-size
    # array to reduction operation maximum" on every sweep).
    host = busy_host(project)
    run = services.run_start(
        project=project,
        public_id="later",
        session="s1",
        started_at=datetime.fromtimestamp(T0 + SPAN + 300, tz=UTC),
        fields={},
    ).run
    store.run_process_record(run=run, session="s1", host="n1", info={"key": [BOOT, 77, 9000]})
    times = np.arange(T0 + SPAN + 300, T0 + SPAN + 1200, 2.0)
    series = services.SeriesIn("loss", np.arange(times.size), np.linspace(3, 2, times.size), times)
    services.batch_ingest(run=run, session="s1", seq=1, series=[series], events=[], heartbeat=None)

    assert gpu_check.gpu_check_host(host_id=host.pk, now=T0 + SPAN + 1200) == []
    assert not Flag.objects.filter(run=run, kind=Flag.Kind.HANG).exists()
