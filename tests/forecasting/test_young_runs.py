"""Runs that die before they have a cadence of their own (a create and up to two batches, or one
MLflow log-metric) are closed by the liveness sweep: against the heartbeat their client declared,
else after RUNCAST_STALL_UNKNOWN_CADENCE_S of silence. Before, `detect_stall` wanted 3 contacts
and such a run stayed "running" for good. A run slow to log its first step is not one of them.

Through the sweep task on the real database, on the real clock: the runs' rows are aged."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from forecasting import tasks
from forecasting.models import Flag, ServerClock
from tracker.models import IngestBatch, Run, RunSegment

pytestmark = pytest.mark.django_db

HEARTBEAT_S = 15.0  # the runcast client's default, as it declares it


@pytest.fixture(autouse=True)
def _listening_for_hours() -> None:
    # The server has been up for hours: a run's silence is its own (forecasting/liveness.py).
    ServerClock.objects.create(
        pk=1,
        listening_since=timezone.now() - timedelta(hours=3),
        last_tick_at=timezone.now() - timedelta(seconds=30),
    )


def create(api: Any, token: str, run_id: str, **extra: Any) -> Run:
    answer = api("POST", "/runs", token, {"id": run_id, "session": "s1", **extra})
    assert answer.status_code == 201, answer.content
    return Run.objects.get(public_id=run_id)


def send(
    api: Any, token: str, run: Run, seq: int, *, steps: Sequence[int] = (), heartbeat: bool = False
) -> None:
    now = timezone.now().timestamp()
    body: dict[str, Any] = {"session": "s1", "seq": seq, "metrics": {}}
    if steps:
        body["metrics"] = {"loss": {"steps": list(steps), "values": [3.0] * len(steps)}}
    if heartbeat:
        body["heartbeat"] = now
    answer = api("POST", f"/runs/{run.public_id}/batches", token, body)
    assert answer.status_code == 200, answer.content


def age(run: Run, seconds: float) -> None:
    """Everything the run said, said `seconds` earlier."""
    back = timedelta(seconds=seconds)
    for segment in RunSegment.objects.filter(run=run):
        RunSegment.objects.filter(pk=segment.pk).update(started_at=segment.started_at - back)
    for batch in IngestBatch.objects.filter(run=run):
        IngestBatch.objects.filter(pk=batch.pk).update(received_at=batch.received_at - back)


def status(run: Run) -> str:
    return Run.objects.get(pk=run.pk).status


@pytest.mark.parametrize("batches", [0, 1, 2])
def test_a_runcast_run_killed_before_its_cadence_is_closed_as_crashed(
    api: Any, write_token: str, batches: int
) -> None:
    # The runcast client declares its heartbeat; killed after its create and `batches` batches.
    run = create(api, write_token, "killed", heartbeat_interval=HEARTBEAT_S)
    for seq in range(1, batches + 1):
        send(api, write_token, run, seq, steps=[seq])

    age(run, 60)  # four heartbeats missed: within the limit (5 of them, at least 60 s)
    tasks.sweep_active_runs()
    assert status(run) == Run.Status.RUNNING
    assert not Flag.objects.filter(run=run).exists()

    age(run, 60)  # eight missed: dead, on the same rule as a run with a cadence seen
    tasks.sweep_active_runs()
    assert status(run) == Run.Status.CRASHED
    flag = Flag.objects.get(run=run, kind=Flag.Kind.STALLED)
    contacts = 1 + batches
    assert flag.state == Flag.State.RAISED
    assert flag.explanation == (
        f"no heartbeat for 2 min ({contacts} contact{'' if contacts == 1 else 's'} since it"
        " started; its client beats every 15 s while alive)"
    )
    assert flag.data["kind"] == "no_heartbeat" and flag.data["usual_interval_s"] is None

    # A late batch (it was only cut off) puts it back to running, as for any run.
    send(api, write_token, run, batches + 1, steps=[batches + 1])
    assert status(run) == Run.Status.RUNNING


def test_a_runcast_run_compiling_for_20_minutes_is_alive_while_it_beats(
    api: Any, write_token: str
) -> None:
    run = create(api, write_token, "compiling", heartbeat_interval=HEARTBEAT_S)
    # No step yet, but the client's sender thread beats every 15 s through the compile.
    for seq in range(1, 81):
        send(api, write_token, run, seq, heartbeat=True)
        age(run, HEARTBEAT_S)
    tasks.sweep_active_runs()
    assert status(run) == Run.Status.RUNNING
    assert not Flag.objects.filter(run=run).exists()


def test_a_run_that_declares_no_heartbeat_is_closed_after_the_fixed_limit(
    client: Client, write_token: str
) -> None:
    # An MLflow client: a create and one log-metric, then nothing (killed, or a slow first step:
    # it sends nothing either way until its loop logs again).
    def post(path: str, body: dict[str, Any]) -> Any:
        answer = client.post(
            f"/api/2.0/mlflow/{path}",
            data=json.dumps(body),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {write_token}",
        )
        assert answer.status_code == 200, answer.content
        return json.loads(answer.content)

    created = post("runs/create", {"experiment_id": "0", "run_name": "slow"})
    run_id = created["run"]["info"]["run_id"]
    now_ms = int(timezone.now().timestamp() * 1000)
    post("runs/log-metric", {"run_id": run_id, "key": "loss", "value": 3.2, "timestamp": now_ms})
    run = Run.objects.get(public_id=run_id)
    limit = settings.RUNCAST_STALL_UNKNOWN_CADENCE_S

    age(run, 20 * 60)  # a 20-minute compile before its second step: no verdict
    tasks.sweep_active_runs()
    assert status(run) == Run.Status.RUNNING
    assert not Flag.objects.filter(run=run).exists()

    age(run, limit - 20 * 60 + 60)  # a minute past the limit
    tasks.sweep_active_runs()
    assert status(run) == Run.Status.CRASHED
    flag = Flag.objects.get(run=run, kind=Flag.Kind.STALLED)
    assert flag.explanation == (
        "no heartbeat for 1 h (2 contacts since it started, too few for a cadence;"
        " 1 h of silence is the limit)"
    )
