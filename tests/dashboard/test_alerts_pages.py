"""Alert pages: members read, owners and members change, viewers cannot, outsiders see 404."""

from __future__ import annotations

import html
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from alerts import services
from alerts.models import Channel, Notification, Rule
from tests.alerts.fixtures import HttpSink, Mailbox, Trickler, flag_raise
from tracker.models import Run

READ = {"owner": 200, "member": 200, "viewer": 200, "outsider": 404}
WRITE = {"owner": 302, "member": 302, "viewer": 403, "outsider": 404}
EDIT_PAGE = {"owner": 200, "member": 200, "viewer": 403, "outsider": 404}
ROLES = ["owner", "member", "viewer", "outsider"]


@pytest.fixture
def channel(run: Run, sink: HttpSink) -> Channel:
    return services.channel_create(
        project=run.project, kind=Channel.Kind.SLACK, name="slack", target=sink.url("/slack")
    )


def login(client: Client, request: Any, role: str) -> User:
    user = request.getfixturevalue(role)
    request.getfixturevalue("other_project")  # the outsider has a project of their own
    client.force_login(user)
    return user


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    "path",
    [
        "/projects/llm/alerts/",
        "/projects/llm/alerts/channels/",
        "/projects/llm/alerts/rules/",
        "/runs/llm/pretrain-3.0/alerts/",
    ],
)
def test_it_shows_read_pages_to_members_only(
    client: Client, request: Any, channel: Channel, role: str, path: str
) -> None:
    login(client, request, role)
    assert client.get(path).status_code == READ[role]


@pytest.mark.parametrize("path", ["/projects/llm/alerts/", "/runs/llm/pretrain-3.0/alerts/"])
def test_it_sends_anonymous_users_to_login(client: Client, run: Run, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_it_lists_history_for_the_project_and_the_run(
    client: Client, owner: User, run: Run, channel: Channel
) -> None:
    other = Run.objects.create(project=run.project, public_id="other-run")
    flag_raise(run, "nan")
    flag_raise(other, "spike")
    services.flags_dispatch()
    client.force_login(owner)

    project_page = client.get("/projects/llm/alerts/").content.decode()
    run_page = client.get("/runs/llm/pretrain-3.0/alerts/").content.decode()

    assert "nan raised" in project_page and "spike raised" in project_page
    assert "nan raised" in run_page and "spike raised" not in run_page
    assert client.get("/runs/llm/no-such-run/alerts/").status_code == 404


def test_it_hides_webhook_urls_from_viewers(client: Client, viewer: User, channel: Channel) -> None:
    client.force_login(viewer)
    page = client.get("/projects/llm/alerts/channels/").content.decode()
    assert channel.target not in page
    assert "Send test message" not in page


def test_it_shows_why_a_channel_was_disabled(
    client: Client, member: User, channel: Channel
) -> None:
    services.channel_disable(channel_id=channel.pk, reason="Slack answered 404 no_service")
    client.force_login(member)
    page = client.get("/projects/llm/alerts/channels/").content.decode()
    assert "disabled</strong>: Slack answered 404 no_service" in page


@pytest.mark.parametrize("role", ROLES)
def test_it_lets_editors_add_a_channel(client: Client, request: Any, run: Run, role: str) -> None:
    login(client, request, role)
    response = client.post(
        "/projects/llm/alerts/channels/",
        {
            "kind": "email",
            "name": "leads",
            "target": "a@example.com\nb@example.com",
            "enabled": "on",
        },
    )
    assert response.status_code == WRITE[role]
    assert Channel.objects.filter(project=run.project).exists() == (WRITE[role] == 302)


def test_it_rejects_a_bad_channel_target(client: Client, owner: User, run: Run) -> None:
    client.force_login(owner)
    bad_email = client.post(
        "/projects/llm/alerts/channels/", {"kind": "email", "name": "x", "target": "not-an-address"}
    )
    bad_url = client.post(
        "/projects/llm/alerts/channels/",
        {"kind": "webhook", "name": "x", "target": "ftp://example.com"},
    )
    assert bad_email.status_code == bad_url.status_code == 400
    assert Channel.objects.count() == 0


@pytest.mark.parametrize("role", ROLES)
def test_it_lets_editors_edit_a_channel(
    client: Client, request: Any, channel: Channel, sink: HttpSink, role: str
) -> None:
    login(client, request, role)
    url = f"/projects/llm/alerts/channels/{channel.pk}/"
    assert client.get(url).status_code == EDIT_PAGE[role]
    response = client.post(
        url, {"kind": "slack", "name": "renamed", "target": sink.url("/slack2"), "enabled": "on"}
    )
    assert response.status_code == WRITE[role]
    channel.refresh_from_db()
    assert (channel.name == "renamed") == (WRITE[role] == 302)


def test_it_re_enables_a_disabled_channel_and_forgets_the_reason(
    client: Client, owner: User, channel: Channel, sink: HttpSink
) -> None:
    services.channel_disable(channel_id=channel.pk, reason="gone")
    client.force_login(owner)
    client.post(
        f"/projects/llm/alerts/channels/{channel.pk}/",
        {"kind": "slack", "name": "slack", "target": sink.url("/new"), "enabled": "on"},
    )
    channel.refresh_from_db()
    assert channel.enabled and channel.disabled_reason == "" and channel.disabled_at is None


@pytest.mark.parametrize("role", ROLES)
def test_it_lets_editors_delete_a_channel(
    client: Client, request: Any, channel: Channel, role: str
) -> None:
    login(client, request, role)
    response = client.post(f"/projects/llm/alerts/channels/{channel.pk}/delete/")
    assert response.status_code == WRITE[role]
    assert Channel.objects.filter(pk=channel.pk).exists() == (WRITE[role] != 302)


def test_it_refuses_to_delete_by_get(client: Client, owner: User, channel: Channel) -> None:
    client.force_login(owner)
    assert client.get(f"/projects/llm/alerts/channels/{channel.pk}/delete/").status_code == 405


@pytest.mark.parametrize("role", ROLES)
def test_it_lets_editors_send_a_test_message(
    client: Client, request: Any, channel: Channel, sink: HttpSink, role: str
) -> None:
    login(client, request, role)
    response = client.post(f"/projects/llm/alerts/channels/{channel.pk}/test/", follow=True)
    if WRITE[role] == 302:
        assert "Test message sent to slack." in response.content.decode()
        assert len(sink.to("/slack")) == 1
    else:
        assert response.status_code == WRITE[role]
        assert sink.to("/slack") == []


def test_it_shows_a_failed_test_message(
    client: Client, owner: User, channel: Channel, sink: HttpSink
) -> None:
    sink.script("/slack", (404, "no_service"))
    client.force_login(owner)
    response = client.post(f"/projects/llm/alerts/channels/{channel.pk}/test/", follow=True)
    assert "failed: Slack answered 404 no_service" in response.content.decode()


def _slow_channel(run: Run, trickler: Trickler, settings: Any) -> Channel:
    settings.RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS = True  # the trickler listens on loopback
    # Deliveries may wait 30 s; a test the member watches waits 1 s.
    settings.RUNCAST_ALERTS_HTTP_TIMEOUT = 30.0
    settings.RUNCAST_ALERTS_TEST_TIMEOUT = 1.0
    return services.channel_create(
        project=run.project, kind=Channel.Kind.WEBHOOK, name="slow", target=trickler.url()
    )


def test_it_answers_a_test_message_to_a_trickling_endpoint_within_the_test_deadline(
    client: Client, owner: User, run: Run, trickler: Trickler, settings: Any
) -> None:
    channel = _slow_channel(run, trickler, settings)
    client.force_login(owner)
    started = time.monotonic()
    response = client.post(f"/projects/llm/alerts/channels/{channel.pk}/test/", follow=True)
    # A behaviour bound, not a timing: the endpoint would take 46 s, deliveries wait 30 s.
    assert time.monotonic() - started < 3 * settings.RUNCAST_ALERTS_TEST_TIMEOUT
    assert "Test message to slow failed: timed out after 1 s" in response.content.decode()
    assert trickler.sent, "the endpoint was answering, a byte at a time"
    assert Channel.objects.get(pk=channel.pk).enabled, "a failed test disables nothing"


def test_it_sends_one_test_message_at_a_time_from_a_web_process(
    client: Client, owner: User, run: Run, trickler: Trickler, settings: Any
) -> None:
    channel = _slow_channel(run, trickler, settings)
    # A first click, still waiting on the endpoint in another of the server's threads.
    first = threading.Thread(target=services.channel_test, kwargs={"channel": channel})
    first.start()
    try:
        assert trickler.received.wait(5), "the first test reached the endpoint"
        client.force_login(owner)
        response = client.post(f"/projects/llm/alerts/channels/{channel.pk}/test/", follow=True)
        assert first.is_alive(), "answered while the first test was still in flight"
        page = response.content.decode()
        assert (
            "Another test message is being sent from this server; try again in a few seconds."
            in page
        )
        assert "Test message sent" not in page
    finally:
        first.join()
    # Once it is over, the next test goes out.
    trickler.interval = 0.001
    response = client.post(f"/projects/llm/alerts/channels/{channel.pk}/test/", follow=True)
    assert "Test message sent to slow." in response.content.decode()


def test_it_keeps_channels_of_other_projects_out_of_reach(
    client: Client, outsider: User, other_project: Any, channel: Channel
) -> None:
    client.force_login(outsider)
    # The outsider owns "other", but the channel belongs to "llm".
    assert client.get(f"/projects/other/alerts/channels/{channel.pk}/").status_code == 404
    assert client.post(f"/projects/other/alerts/channels/{channel.pk}/delete/").status_code == 404


@pytest.mark.parametrize("role", ROLES)
def test_it_lets_editors_edit_a_rule(
    client: Client, request: Any, run: Run, channel: Channel, role: str
) -> None:
    services.rules_ensure_defaults(project=run.project)
    rule = Rule.objects.get(project=run.project, kind="slip")
    login(client, request, role)
    url = "/projects/llm/alerts/rules/slip/"
    assert client.get(url).status_code == EDIT_PAGE[role]
    response = client.post(
        url,
        {
            "severity": "critical",
            "threshold": "12",
            "muted": "on",
            "cooldown": "02:00:00",
            "channels": [channel.pk],
        },
    )
    assert response.status_code == WRITE[role]
    rule.refresh_from_db()
    if WRITE[role] == 302:
        assert (rule.severity, rule.threshold, rule.muted) == ("critical", 12.0, True)
        assert list(rule.channels.all()) == [channel]
        assert rule.cooldown.total_seconds() == 7200
    else:
        assert (rule.severity, rule.threshold, rule.muted) == ("warning", 3.0, False)


def test_it_lists_default_rules_on_first_visit_without_writing(
    client: Client, viewer: User, member: User, run: Run
) -> None:
    client.force_login(viewer)
    page = client.get("/projects/llm/alerts/rules/").content.decode()
    assert "Loss became NaN/Inf" in page and "Deadline at risk" in page
    assert "Edit" not in page
    client.force_login(member)
    assert client.get("/projects/llm/alerts/rules/deadline/").status_code == 200
    assert not Rule.objects.filter(project=run.project).exists()  # a GET writes nothing


def test_it_saves_a_default_rule_on_its_first_edit(client: Client, member: User, run: Run) -> None:
    client.force_login(member)
    response = client.post(
        "/projects/llm/alerts/rules/deadline/",
        {"severity": "warning", "threshold": "0.3", "cooldown": "01:00:00"},
    )
    assert response.status_code == 302
    rule = Rule.objects.get(project=run.project, kind="deadline")
    assert (rule.severity, rule.threshold) == ("warning", 0.3)
    assert client.get("/projects/llm/alerts/rules/no-such-kind/").status_code == 404


def test_it_mutes_a_rule_from_the_page(
    client: Client, member: User, run: Run, channel: Channel
) -> None:
    client.force_login(member)
    client.post(
        "/projects/llm/alerts/rules/nan/",
        {"severity": "critical", "muted": "on", "cooldown": "01:00:00"},
    )

    flag_raise(run, "nan")
    services.flags_dispatch()
    assert Notification.objects.count() == 0


@pytest.mark.parametrize("cooldown", ["1000000 00:00:00", "-01:00:00"])
def test_it_refuses_a_cooldown_out_of_range(
    client: Client, member: User, run: Run, cooldown: str
) -> None:
    services.rules_ensure_defaults(project=run.project)
    rule = Rule.objects.get(project=run.project, kind="nan")
    client.force_login(member)
    response = client.post(
        "/projects/llm/alerts/rules/nan/", {"severity": "critical", "cooldown": cooldown}
    )
    assert response.status_code == 200
    assert "cooldown" in response.context["form"].errors
    rule.refresh_from_db()
    assert rule.cooldown.total_seconds() == 3600


def test_it_validates_an_edited_target_against_the_channels_own_kind(
    client: Client, owner: User, channel: Channel
) -> None:
    client.force_login(owner)
    response = client.post(
        f"/projects/llm/alerts/channels/{channel.pk}/",
        {"kind": "email", "name": "slack", "target": "lead@example.com", "enabled": "on"},
    )
    assert response.status_code == 200
    channel.refresh_from_db()
    assert channel.kind == "slack" and channel.target.startswith("http")


def test_it_answers_404_to_a_run_id_with_a_nul(client: Client, member: User, run: Run) -> None:
    client.force_login(member)
    assert client.get("/runs/llm/a%00b/alerts/").status_code == 404


def test_the_history_shows_what_would_have_been_sent_without_a_channel(
    client: Client, viewer: User, run: Run
) -> None:
    flag_raise(run, "nan", explanation="Loss became NaN/Inf at step 10,000.")
    services.flags_dispatch()
    client.force_login(viewer)
    page = client.get("/projects/llm/alerts/").content.decode()
    assert "Loss became NaN/Inf at step 10,000." in page
    assert "not sent: no channel" in page


def test_the_history_says_what_a_run_end_message_says_and_when_in_the_viewers_zone(
    client: Client, viewer: User, run: Run
) -> None:
    # The demo's drill crashed; its history row read "the run failed" (the rule's name), while the
    # message a channel gets says "crashed at step ...". And the page printed its times in UTC
    # under a header that says "times in Europe/Berlin".
    from django.utils import timezone

    run.status, run.ended_at, run.last_step = Run.Status.CRASHED, timezone.now(), 10_085
    run.save(update_fields=["status", "ended_at", "last_step"])
    services.run_end_dispatch(run_id=run.id)
    client.force_login(viewer)
    for url in ("/projects/llm/alerts/", f"/runs/llm/{run.public_id}/alerts/"):
        page = client.get(url).content.decode()
        assert "the run failed" not in page
        assert f"{run} crashed at step 10,085" in page
        assert "When (UTC)" not in page and '<time data-fmt="local" datetime="' in page


def test_the_historys_notes_and_messages_are_in_the_viewers_zone(
    client: Client, viewer: User, run: Run, channel: Channel
) -> None:
    """Seen: the Note "cooldown: a nan alert went out at 03:30 UTC" beside a When column in
    CET, and flag texts in the project's zone. Both hold stamps the page writes as <time>s."""
    from django.utils import timezone

    from forecasting.estimators import formatting as fmt

    run.project.timezone = "Asia/Shanghai"
    run.project.save(update_fields=["timezone"])
    finish = timezone.now().timestamp() + 3600
    first = flag_raise(run, "nan", explanation=f"NaN; finish was {fmt.stamp(finish)}")
    services.flags_dispatch()
    flag_raise(run, "nan", created_at=first.created_at + timedelta(minutes=5))
    services.flags_dispatch()
    held = Notification.objects.get(status=Notification.Status.SUPPRESSED)
    assert held.reason.startswith("cooldown: a nan alert went out at \u27e6")
    client.force_login(viewer)
    page = client.get("/projects/llm/alerts/").content.decode()
    sent = first.created_at.replace(second=0, microsecond=0).isoformat()
    assert f'went out at <time data-fmt="when" datetime="{sent}">' in page
    at = datetime.fromtimestamp(finish // 60 * 60, tz=UTC).isoformat()
    assert f'NaN; finish was <time data-fmt="when" datetime="{at}">' in page
    assert "CST" not in page and "\u27e6" not in page


def test_the_rules_list_shows_each_threshold_in_force(
    client: Client, viewer: User, run: Run
) -> None:
    # The demo's rules page showed a dash as every rule's threshold: the template asked
    # `kind.passes`, a function, which the template language calls with no arguments (it fails,
    # so it reads as empty). On call, "Deadline at risk" must say it alerts below 0.5.
    client.force_login(viewer)
    page = client.get("/projects/llm/alerts/rules/").content.decode()
    row = next(r for r in page.split("<tr>") if "Deadline at risk" in r)
    assert "0.5" in row and "chance of finishing by cutoff minus buffer" in row
    row = next(r for r in page.split("<tr>") if "ETA slipped" in r)
    assert "3.0" in row and "hours the P50 finish must have slipped" in row


@pytest.mark.eager
def test_a_run_end_row_keeps_saying_what_was_sent_after_a_resume(
    client: Client,
    viewer: User,
    run: Run,
    mailbox: Mailbox,
    django_capture_on_commit_callbacks: Any,
) -> None:
    # The demo drill crashed, then resumed from its checkpoint: its "failed" row then read
    # "<run> running at step 11,445 of 20,000", the run's state now, not the ending it records;
    # then only "<run> crashed", no longer what the email had said ("crashed at step 10,200 of
    # 20,000 after 5 min"). The row shows the message as it was sent.
    from django.utils import timezone

    services.channel_create(
        project=run.project, kind=Channel.Kind.EMAIL, name="leads", target="lead@example.com"
    )
    run.status, run.ended_at, run.last_step = Run.Status.CRASHED, timezone.now(), 10_200
    run.total_steps = 20_000
    run.started_at = run.ended_at - timedelta(minutes=5)
    run.save(update_fields=["status", "ended_at", "last_step", "total_steps", "started_at"])
    with django_capture_on_commit_callbacks(execute=True):
        services.run_end_dispatch(run_id=run.id)
    (email,) = mailbox.messages
    sent = email["Subject"].removeprefix("[Runcast CRITICAL] ")
    assert sent.startswith(f"{run} crashed at step 10,200 of 20,000 after 5 min")

    run.status, run.ended_at, run.last_step = Run.Status.RUNNING, None, 11_445
    run.current_segment += 1
    run.save(update_fields=["status", "ended_at", "last_step", "current_segment"])
    client.force_login(viewer)
    for url in ("/projects/llm/alerts/", f"/runs/llm/{run.public_id}/alerts/"):
        page = html.unescape(client.get(url).content.decode())
        assert sent in page
        assert "running at step" not in page and "11,445" not in page


def test_the_history_names_a_crash_a_crash(client: Client, viewer: User, run: Run) -> None:
    # The history's "What" read "failed ended" for a run the client reported crashed.
    from django.utils import timezone

    run.status, run.ended_at = Run.Status.CRASHED, timezone.now()
    run.save(update_fields=["status", "ended_at"])
    services.run_end_dispatch(run_id=run.id)
    client.force_login(viewer)
    page = client.get("/projects/llm/alerts/").content.decode()
    row = next(r for r in page.split("<tr") if "pretrain-3.0 crashed" in r)
    what = row.split("<td>")[3]
    assert what.startswith("run crashed "), what
    assert "failed ended" not in page
