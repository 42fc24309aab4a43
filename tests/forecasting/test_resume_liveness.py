"""Flags as a lead reads them: the liveness sweep at a resume, and what a cleared flag says."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from django.utils import timezone

from forecasting import flags, liveness
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
    flags.flags_close(run=Run.objects.get(pk=run.pk), reason="the run crashed", now=died)
    before = set(Flag.objects.filter(run=run).values_list("pk", flat=True))

    run_start(
        project=project,
        public_id=run.public_id,
        session="s2",
        started_at=from_epoch(timezone.now().timestamp()),
        fields={},
    )
    liveness.run_check_liveness(run_id=run.pk)

    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    new = Flag.objects.filter(run=run).exclude(pk__in=before)
    assert list(new.values_list("kind", "state")) == []


def test_a_cleared_flag_quotes_what_it_said_as_past(project):
    # "nan cleared: Loss became NaN/Inf at step 10,000 ... and is still not finite" on the run
    # page and the alert history: the line that says it cleared said the loss still was NaN.
    from forecasting.conditions import Condition
    from forecasting.flags import flags_sync

    run = make_run(project)
    text = "Loss became NaN/Inf at step 10,000 and is still not finite."
    flags_sync(run=run, conditions=[Condition("nan", text)], kinds=("nan",), now=timezone.now())
    (cleared,) = flags_sync(run=run, conditions=[], kinds=("nan",), now=timezone.now())
    assert cleared.state == Flag.State.RESOLVED
    assert cleared.explanation == f"nan cleared (it said: {text})"
