"""Done-when of issue 10: a torchrun-style job (four processes with RANK / WORLD_SIZE, one made
slower) logs through the real client to a live server; the straggler shows on the run page and
exactly one alert (email and webhook) names the rank and the what-if finish."""

from __future__ import annotations

import multiprocessing
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from alerts import services as alert_services
from alerts.models import Channel
from forecasting import compute
from forecasting.models import Flag
from tests.alerts.fixtures import HttpSink, Mailbox
from tests.client.ddp_worker import train
from tracker.models import ApiToken, Deadline, Membership, Project, RankTimingChunk, Run
from tracker.services import token_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORLD = 4
STEPS = 240
SLOW_RANK = 2


def wait_for(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


# Its alerts are dispatched and delivered by the tasks the flag's writer enqueues, in-process.
@pytest.mark.eager
def test_a_slow_rank_of_a_torchrun_job_shows_on_the_run_page_and_alerts_once(
    live_server: Any,
    mailbox: Mailbox,
    sink: HttpSink,
    no_default_slack: None,
    django_user_model: Any,
    tmp_path: Any,
    client: Any,
) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("in-memory SQLite locks tables five writers share; CI uses PostgreSQL")
    lead = django_user_model.objects.create_user("lead", "lead@example.com", "pw-lead-123")
    project = Project.objects.create(slug="ddp", name="DDP")
    Membership.objects.create(project=project, user=lead, role=Membership.Role.OWNER)
    Deadline.objects.create(
        project=project,
        slug="eval",
        name="blind eval",
        cutoff=timezone.now() + timedelta(minutes=30),
    )
    alert_services.channel_create(
        project=project, kind=Channel.Kind.EMAIL, name="leads", target="lead@example.com"
    )
    alert_services.channel_create(
        project=project, kind=Channel.Kind.WEBHOOK, name="hook", target=sink.url("/hook")
    )
    token = token_create(project=project, name="t", scope=ApiToken.Scope.WRITE)
    plan = {
        "project": "ddp",
        "deadline": "eval",
        "total_steps": 4 * STEPS,
        "steps": STEPS,
        "compute_s": 0.02,
        "slow_rank": SLOW_RANK,
        "slow_from": 60,
        "factor": 1.6,
        "hold_s": 240.0,
    }
    ctx = multiprocessing.get_context("spawn")
    barrier, release = ctx.Barrier(WORLD), ctx.Event()
    procs = []
    for rank in range(WORLD):
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(WORLD),
            "TORCHELASTIC_RUN_ID": "ddp-job-1",  # what torchrun gives every rank alike
            "RUNCAST_URL": live_server.url,
            "RUNCAST_TOKEN": token,
            "RUNCAST_DIR": str(tmp_path / f"spool-{rank}"),
            "RUNCAST_FLUSH_INTERVAL": "0.2",
            "RUNCAST_TIMING_INTERVAL": "0.5",
        }
        procs.append(ctx.Process(target=train, args=(env, barrier, release, plan)))
    try:
        for p in procs:
            p.start()
        # Every rank's timings up to the last step, and rank 0's progress, have arrived.
        wait_for(
            lambda: (
                RankTimingChunk.objects.filter(max_step=STEPS - 1).count() == WORLD
                and Run.objects.filter(public_id="torchrun-ddp-job-1", last_step=STEPS - 1).exists()
            ),
            timeout=120,
        )
        run = Run.objects.get(public_id="torchrun-ddp-job-1")
        assert run.world_size == WORLD and run.current_segment == 1  # ranks are no attempts
        assert sorted(set(RankTimingChunk.objects.values_list("rank", flat=True))) == [0, 1, 2, 3]
        # Forecasts over the flags' hysteresis window (what the sweeper does every 15 s).
        now = timezone.now()
        for k in range(4):
            compute.forecast_compute(run_id=run.pk, now=now + timedelta(seconds=20 * k))

        flag = Flag.objects.get(run=run, kind=Flag.Kind.STRAGGLER, state=Flag.State.RAISED)
        assert flag.data["ranks"] == [SLOW_RANK]
        assert flag.data["host"] == socket.gethostname()
        wait_for(lambda: len(mailbox.messages) >= 1 and len(sink.to("/hook")) >= 1)
        time.sleep(1.0)  # anything duplicated would arrive now
        mails = [m for m in mailbox.messages if "slower" in m["Subject"]]
        hooks = [r for r in sink.to("/hook") if b'"straggler"' in r.body]
        assert len(mails) == 1, [m["Subject"] for m in mailbox.messages]
        assert len(hooks) == 1
        subject = mails[0]["Subject"]
        assert f"rank {SLOW_RANK} on {socket.gethostname()}" in subject
        assert "without it: finish" in subject and "UTC" in subject

        client.force_login(lead)
        html = client.get("/runs/ddp/torchrun-ddp-job-1/").content.decode()
        assert 'id="straggler-card"' in html and f"rank {SLOW_RANK} on" in html
        assert "Without it: finish" in html
        ranks = client.get("/runs/ddp/torchrun-ddp-job-1/ranks.json").json()
        assert ranks["slowest"][0]["rank"] == SLOW_RANK
        assert ranks["slowest"][0]["ratio"] > 1.3
        markers = client.get("/runs/ddp/torchrun-ddp-job-1/overview.json").json()["markers"]
        assert [m["kind"] for m in markers].count("straggler") == 1
    finally:
        release.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * WORLD
    assert Run.objects.get(public_id="torchrun-ddp-job-1").status == Run.Status.FINISHED
