"""The liveness sweep at a resume: the job's init is contact, before its first batch."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from django.utils import timezone

from forecasting import services
from forecasting.models import Flag
from tests.forecasting.test_services import healthy_loss, make_run, send
from tracker.models import IngestBatch, Run
from tracker.services import from_epoch, run_start


def test_a_sweep_between_a_resume_and_its_first_batch_finds_no_stall(project):
    # The demo drill died of its NaN, resumed two minutes later, and the sweep that ran between
    # its init and its first batch read the two minutes of silence as the new attempt's: it
    # marked the run crashed, raised "no heartbeat for 2 min" and sent the old NaN alert again.
    run = make_run(project)
    for i in range(20):
        steps = np.arange(i * 10, (i + 1) * 10)
        loss = healthy_loss(steps)
        if i == 19:
            loss[5:] = np.nan
        send(run, steps, loss, seq=i + 1)
    died = timezone.now() - timedelta(minutes=2)
    for k, batch in enumerate(IngestBatch.objects.filter(run=run).order_by("seq")):
        IngestBatch.objects.filter(pk=batch.pk).update(received_at=died - timedelta(seconds=20 - k))
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CRASHED, ended_at=died)
    services.flags_close(run=Run.objects.get(pk=run.pk), reason="the run crashed", now=died)
    before = set(Flag.objects.filter(run=run).values_list("pk", flat=True))

    run_start(
        project=project,
        public_id=run.public_id,
        session="s2",
        started_at=from_epoch(timezone.now().timestamp()),
        fields={},
    )
    services.run_check_liveness(run_id=run.pk)

    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    new = Flag.objects.filter(run=run).exclude(pk__in=before)
    assert list(new.values_list("kind", "state")) == []
