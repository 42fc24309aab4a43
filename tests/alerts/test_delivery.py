"""Delivery: claimed once, retried with backoff on transient errors, given up on permanent ones."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery.signals import after_task_publish
from django.utils import timezone

from alerts import services, tasks
from alerts.models import Channel, Notification
from tests.alerts.fixtures import BOUNCE_DOMAIN, HttpSink, Mailbox, flag_raise
from tracker.models import Run

S = Notification.Status


def notification_for(run: Run, channel: Channel) -> Notification:
    flag_raise(run, "nan")
    services.flags_dispatch()
    return Notification.objects.get(channel=channel)


@pytest.fixture
def slack(run: Run, sink: HttpSink) -> Channel:
    return services.channel_create(
        project=run.project, kind=Channel.Kind.SLACK, name="slack", target=sink.url("/slack")
    )


@pytest.fixture
def webhook(run: Run, sink: HttpSink) -> Channel:
    return services.channel_create(
        project=run.project, kind=Channel.Kind.WEBHOOK, name="hook", target=sink.url("/hook")
    )


def test_it_retries_a_500_then_succeeds(run: Run, slack: Channel, sink: HttpSink) -> None:
    sink.script("/slack", (500, "internal_error"), (200, "ok"))
    n = notification_for(run, slack)
    now = timezone.now()

    retry_in = services.notification_deliver(notification_id=n.pk, now=now)
    n.refresh_from_db()
    assert retry_in == 30.0
    assert (n.status, n.tries) == (S.PENDING, 1)
    assert "500 internal_error" in n.reason

    # Not due yet: an early copy of the task changes nothing.
    assert services.notification_deliver(notification_id=n.pk, now=now) is None
    assert len(sink.to("/slack")) == 1

    services.notification_deliver(notification_id=n.pk, now=now + timedelta(seconds=31))
    n.refresh_from_db()
    assert (n.status, n.tries, n.reason) == (S.SENT, 2, "")
    assert len(sink.to("/slack")) == 2


def test_it_backs_off_exponentially_and_gives_up(
    run: Run, webhook: Channel, sink: HttpSink, settings: Any
) -> None:
    settings.RUNCAST_ALERTS_MAX_TRIES = 3
    sink.script("/hook", *[(503, "busy")] * 3)
    n = notification_for(run, webhook)
    now = timezone.now()

    delays = []
    for _ in range(3):
        delays.append(services.notification_deliver(notification_id=n.pk, now=now))
        now += timedelta(hours=1)

    n.refresh_from_db()
    assert delays == [30.0, 120.0, None]
    assert (n.status, n.tries) == (S.FAILED, 3)
    assert n.reason.startswith("gave up after 3 tries")
    webhook.refresh_from_db()
    assert webhook.enabled  # a busy server is not a broken channel


def test_a_retry_due_later_than_the_longest_countdown_is_left_to_the_sweep(
    run: Run, webhook: Channel, sink: HttpSink
) -> None:
    """A message held for its countdown past the broker's visibility timeout would be handed
    out again meanwhile (issue 24 item 7): a retry due in 2 minutes is not queued, and the
    sweep enqueues it once due."""
    sink.script("/hook", (503, "busy"), (503, "busy"))
    n = notification_for(run, webhook)
    queued: list[tuple[str, Any]] = []

    def note(sender: str | None = None, headers: Any = None, **kwargs: Any) -> None:
        queued.append((str(sender), (headers or {}).get("eta")))

    after_task_publish.connect(note, weak=False)
    try:
        tasks.deliver_notification(n.pk)  # fails: the retry in 30 s is queued
        assert [name for name, eta in queued if eta] == ["alerts.tasks.deliver_notification"]
        queued.clear()
        Notification.objects.filter(pk=n.pk).update(next_attempt_at=timezone.now())
        tasks.deliver_notification(n.pk)  # fails again: the next try is 120 s away
        assert queued == []
    finally:
        after_task_publish.disconnect(note)
    n.refresh_from_db()
    assert (n.status, n.tries) == (S.PENDING, 2)
    assert services.notifications_due(now=n.next_attempt_at) == [n.pk]


def test_it_retries_a_timeout(run: Run, slack: Channel, sink: HttpSink, settings: Any) -> None:
    settings.RUNCAST_ALERTS_HTTP_TIMEOUT = 0.3
    sink.script("/slack", (200, "ok", 1.0), (200, "ok"))
    n = notification_for(run, slack)

    assert services.notification_deliver(notification_id=n.pk) == 30.0
    n.refresh_from_db()
    assert (n.status, n.tries) == (S.PENDING, 1)
    assert "timed out after 0.3 s" in n.reason

    services.notification_deliver(notification_id=n.pk, now=timezone.now() + timedelta(minutes=1))
    n.refresh_from_db()
    assert (n.status, n.tries) == (S.SENT, 2)


def test_it_disables_a_slack_channel_on_no_service(
    run: Run, slack: Channel, sink: HttpSink
) -> None:
    sink.script("/slack", (404, "no_service"))
    n = notification_for(run, slack)

    assert services.notification_deliver(notification_id=n.pk) is None

    n.refresh_from_db()
    slack.refresh_from_db()
    assert (n.status, n.tries) == (S.FAILED, 1)
    assert not slack.enabled
    assert slack.disabled_reason == "Slack answered 404 no_service"
    # Later alerts are not even created for a disabled channel (only the "no channel" record).
    flag_raise(run, "spike")
    services.flags_dispatch()
    assert Notification.objects.filter(channel__isnull=False).count() == 1


def test_it_disables_a_webhook_on_410(run: Run, webhook: Channel, sink: HttpSink) -> None:
    sink.script("/hook", (410, "gone"))
    n = notification_for(run, webhook)

    services.notification_deliver(notification_id=n.pk)

    webhook.refresh_from_db()
    assert not webhook.enabled and "410" in webhook.disabled_reason


def test_it_disables_an_email_channel_whose_address_is_refused(run: Run, mailbox: Mailbox) -> None:
    channel = services.channel_create(
        project=run.project, kind=Channel.Kind.EMAIL, name="bad", target=f"x@{BOUNCE_DOMAIN}"
    )
    n = notification_for(run, channel)

    services.notification_deliver(notification_id=n.pk)

    channel.refresh_from_db()
    n.refresh_from_db()
    assert n.status == S.FAILED
    assert not channel.enabled
    assert "recipient refused" in channel.disabled_reason
    assert mailbox.messages == []


def test_it_retries_when_the_smtp_server_is_down(run: Run, mailbox: Mailbox, settings: Any) -> None:
    channel = services.channel_create(
        project=run.project, kind=Channel.Kind.EMAIL, name="leads", target="lead@example.com"
    )
    n = notification_for(run, channel)
    settings.EMAIL_PORT = 1  # nothing listens there

    assert services.notification_deliver(notification_id=n.pk) == 30.0
    n.refresh_from_db()
    channel.refresh_from_db()
    assert n.status == S.PENDING and channel.enabled


def test_it_fails_pending_notifications_of_a_disabled_channel(
    run: Run, slack: Channel, sink: HttpSink
) -> None:
    n = notification_for(run, slack)
    services.channel_disable(channel_id=slack.pk, reason="Slack answered 403 invalid_token")

    services.notification_deliver(notification_id=n.pk)

    n.refresh_from_db()
    assert n.status == S.FAILED and "invalid_token" in n.reason
    assert sink.to("/slack") == []


def test_it_delivers_only_when_it_wins_the_claim(run: Run, slack: Channel, sink: HttpSink) -> None:
    n = notification_for(run, slack)
    Notification.objects.filter(pk=n.pk).update(status=S.SENDING)  # another worker has it

    tasks.deliver_notification(n.pk)

    assert sink.to("/slack") == []


def test_it_delivers_once_when_the_task_runs_twice(
    run: Run, slack: Channel, sink: HttpSink
) -> None:
    n = notification_for(run, slack)

    tasks.deliver_notification(n.pk)
    tasks.deliver_notification(n.pk)

    assert len(sink.to("/slack")) == 1
    n.refresh_from_db()
    assert (n.status, n.tries) == (S.SENT, 1)


def test_it_fails_rather_than_resends_what_a_dead_worker_left(
    run: Run, slack: Channel, sink: HttpSink
) -> None:
    n = notification_for(run, slack)
    claimed = timezone.now() - timedelta(minutes=11)
    Notification.objects.filter(pk=n.pk).update(status=S.SENDING, claimed_at=claimed, tries=1)

    services.notifications_due()

    n.refresh_from_db()
    assert n.status == S.FAILED and "cannot arrive twice" in n.reason
    assert sink.to("/slack") == []
