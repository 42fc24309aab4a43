"""The whole path: the real client logs a run whose loss goes NaN to the live server; the
forecast flags it; one email reaches the SMTP server and one Slack message the HTTP sink."""

from __future__ import annotations

import time
from typing import Any

import pytest
import runcast
from runcast.settings import Settings

from alerts import services as alert_services
from alerts.models import Channel
from forecasting.models import Flag
from tests.alerts.fixtures import HttpSink, Mailbox
from tracker.models import ApiToken, Membership, Project
from tracker.services import token_create

# The client, the live server and the in-process tasks (forecast, dispatch, delivery) together.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.eager]


def wait_for(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_nan_loss_from_the_client_alerts_once(
    live_server: Any,
    mailbox: Mailbox,
    sink: HttpSink,
    no_default_slack: None,
    django_user_model: Any,
    tmp_path: Any,
) -> None:
    owner = django_user_model.objects.create_user("lead", "lead@example.com", "pw-lead-123")
    project = Project.objects.create(slug="e2e", name="E2E", gpu_hour_price=2.5)
    Membership.objects.create(project=project, user=owner, role=Membership.Role.OWNER)
    alert_services.channel_create(
        project=project, kind=Channel.Kind.EMAIL, name="leads", target="lead@example.com"
    )
    alert_services.channel_create(
        project=project, kind=Channel.Kind.SLACK, name="slack", target=sink.url("/slack")
    )
    token = token_create(project=project, name="t", scope=ApiToken.Scope.WRITE)
    settings = Settings(url=live_server.url, token=token, dir=tmp_path, flush_interval=0.05)

    run = runcast.init(project="e2e", id="pretrain-nan", total_steps=5000, settings=settings)
    for step in range(2000):
        run.log({"loss": 2.0 + 8.0 * (step + 10.0) ** -0.3}, step=step)
    for step in range(2000, 2010):
        run.log({"loss": float("nan")}, step=step)
    run.finish(status="failed")

    wait_for(lambda: Flag.objects.filter(run__public_id="pretrain-nan", kind="nan").exists())
    wait_for(lambda: len(mailbox.messages) >= 1 and len(sink.to("/slack")) >= 1)
    time.sleep(1.0)  # anything duplicated would arrive now
    nan_mail = [m for m in mailbox.messages if "NaN" in m["Subject"]]
    nan_slack = [r for r in sink.to("/slack") if "NaN" in r.body.decode()]
    assert len(nan_mail) == 1, [m["Subject"] for m in mailbox.messages]
    assert len(nan_slack) == 1
    assert "pretrain-nan loss became NaN/Inf at step 2,000" in nan_mail[0]["Subject"]
