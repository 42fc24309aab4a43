"""The straggler rule: a straggler flag goes out through the same rules and channels, naming the
rank, its host and the what-if finish; the threshold is the finish it would gain."""

from __future__ import annotations

import json
from typing import Any

import pytest

from alerts import services, tasks
from alerts.kinds import BY_KEY
from alerts.models import Channel, Notification, Rule
from tests.alerts.fixtures import HttpSink, Mailbox, flag_raise
from tracker.models import Project, Run

T = 1_780_000_000.0  # 2026-05-28 20:26:40 UTC


def straggler_data(gain_h: float) -> dict[str, Any]:
    return {
        "kind": "rank",
        "ranks": [17],
        "host": "node-3",
        "slowdown": 0.23,
        "onset_step": 41_200,
        "cost_s": 1.9 * 3600,
        "finish_p50": T + gain_h * 3600,
        "whatif_finish_p50": T,
        "p_on_time": 0.42,
        "whatif_p_on_time": 0.81,
    }


@pytest.fixture
def channels(project: Project, sink: HttpSink, mailbox: Mailbox) -> None:
    services.channel_create(
        project=project, kind=Channel.Kind.EMAIL, name="leads", target="lead@example.com"
    )
    services.channel_create(
        project=project, kind=Channel.Kind.WEBHOOK, name="hook", target=sink.url("/hook")
    )


@pytest.mark.eager
def test_it_alerts_a_straggler_with_rank_host_and_whatif_finish(
    run: Run,
    channels: None,
    mailbox: Mailbox,
    sink: HttpSink,
    django_capture_on_commit_callbacks: Any,
) -> None:
    flag_raise(
        run,
        "straggler",
        explanation="rank 17 on node-3 is 23% slower since step 41,200",
        onset_step=41_200,
        severity=0.23,
        data=straggler_data(gain_h=5.0),
    )
    with django_capture_on_commit_callbacks(execute=True):
        tasks.dispatch_flags()

    assert len(mailbox.messages) == 1
    mail = mailbox.messages[0]
    subject = mail["Subject"]
    assert "rank 17 on node-3 is 23% slower since step 41,200" in subject
    assert "without it: finish 05-28 20:26 UTC" in subject
    body = mail.get_body(("plain",)).get_content()
    assert "without it: finish 05-28 20:26 UTC (P on time 81% instead of 42%)" in body
    assert "Finish without the straggler: 05-28 20:26 UTC" in body
    assert "Job time lost so far: 1.9 h" in body
    hook = json.loads(sink.to("/hook")[0].body)
    assert hook["kind"] == "straggler" and hook["data"]["ranks"] == [17]
    assert Rule.objects.get(project=run.project, kind="straggler").threshold == 0.0


def test_it_holds_back_a_straggler_below_the_rules_hours(
    run: Run, channels: None, mailbox: Mailbox, django_capture_on_commit_callbacks: Any
) -> None:
    services.rules_ensure_defaults(project=run.project)
    Rule.objects.filter(project=run.project, kind="straggler").update(threshold=2.0)
    flag_raise(run, "straggler", data=straggler_data(gain_h=1.0))
    with django_capture_on_commit_callbacks(execute=True):
        tasks.dispatch_flags()
    assert mailbox.messages == []
    assert not Notification.objects.filter(status=Notification.Status.SENT).exists()
    assert BY_KEY["straggler"].passes is not None
    assert BY_KEY["straggler"].passes(None, straggler_data(gain_h=3.0), 2.0)
