"""The run lifecycle: running -> finished / failed / crashed / stalled, with resume.

Each transition as the API and the sweeper drive it, and the defects it once had.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.utils import timezone

from forecasting import liveness
from forecasting.models import Flag
from tests.tracker.test_ingest_api import batch, create, series
from tracker.models import Run
from tracker.services import SeriesIn, batch_ingest, run_finish, run_start
from tracker.signals import run_finished

pytestmark = pytest.mark.django_db


def finish(api: Any, token: str, status: str = "finished", **extra: Any) -> Any:
    return api("POST", "/runs/run-1/finish", token, {"status": status, **extra})


def test_a_late_finish_from_an_older_session_does_not_end_the_resumed_run(api, write_token):
    create(api, write_token, session="attempt-1")
    batch(api, write_token, session="attempt-1", metrics={"loss": series(0, 50)})
    create(api, write_token, session="attempt-2")  # the job resumed from a checkpoint

    # attempt-1's spool replays its finish ("crashed" as the job died) after the resume.
    res = finish(api, write_token, "crashed", session="attempt-1")

    assert res.status_code == 200 and res.json()["status"] == "running"
    batch(api, write_token, session="attempt-2", metrics={"loss": series(40, 20)})
    run = Run.objects.get()
    assert (run.status, run.ended_at, run.last_step) == ("running", None, 59)
    assert finish(api, write_token, session="attempt-2").json()["status"] == "finished"


def test_a_new_attempt_that_speaks_revives_an_ended_run(api, write_token):
    create(api, write_token, session="attempt-1")
    finish(api, write_token, "failed", session="attempt-1")
    # attempt-2's create was lost; its batches arrive from its spool.
    batch(api, write_token, session="attempt-2", metrics={"loss": series(0, 5)})
    run = Run.objects.get()
    assert (run.status, run.ended_at, run.current_segment) == ("running", None, 2)


def test_a_late_batch_of_the_finished_attempt_leaves_it_finished(api, write_token):
    create(api, write_token, session="attempt-1")
    finish(api, write_token, session="attempt-1")
    batch(api, write_token, session="attempt-1", seq=7, metrics={"loss": series(0, 5)})
    assert Run.objects.get().status == "finished"


def test_a_finish_without_a_session_ends_the_run(api, write_token):
    create(api, write_token, session="attempt-1")
    create(api, write_token, session="attempt-2")
    assert finish(api, write_token).json()["status"] == "finished"


def test_a_retried_finish_notifies_once(project, django_capture_on_commit_callbacks):
    run = run_start(
        project=project, public_id="r1", session="s", started_at=timezone.now(), fields={}
    ).run
    sent: list[int] = []

    def count(sender: Any, run_id: int, **kwargs: Any) -> None:
        sent.append(run_id)

    run_finished.connect(count)
    try:
        for _ in range(3):  # the client retries a finish whose answer it lost
            with django_capture_on_commit_callbacks(execute=True):
                run_finish(run=run, status="finished", ended_at=timezone.now(), session="s")
        with django_capture_on_commit_callbacks(execute=True):
            run_finish(run=run, status="failed", ended_at=timezone.now(), session="s")
    finally:
        run_finished.disconnect(count)
    assert sent == [run.pk, run.pk]  # finished once, then the change to failed


@pytest.mark.eager
def test_a_stalled_flag_resolves_when_the_run_ends(project, django_capture_on_commit_callbacks):
    run = run_start(
        project=project,
        public_id="r1",
        session="s",
        started_at=timezone.now(),
        fields={"total_steps": 10_000},
    ).run
    now = timezone.now().timestamp()
    for i in range(20):
        steps = np.arange(i * 10, (i + 1) * 10)
        loss = 2.0 + 8.0 * (steps + 10.0) ** -0.3
        times = now - 200 + steps.astype(float)
        batch_ingest(
            run=run,
            session="s",
            seq=i + 1,
            series=[SeriesIn("loss", steps, loss, times)],
            events=[],
            heartbeat=None,
        )
    later = timezone.now() + timedelta(hours=1)
    liveness.run_check_liveness(run_id=run.pk, now=later)
    assert Flag.objects.filter(run=run, kind="stalled").latest("id").state == "raised"

    # The job was only cut off; its finish arrives (through the real signal and task path).
    with django_capture_on_commit_callbacks(execute=True):
        run_finish(run=run, status="finished", ended_at=later, session="s")

    flag = Flag.objects.filter(run=run, kind="stalled").latest("id")
    assert flag.state == "resolved" and "finished" in flag.explanation
