"""The daily digest to project owners: runs against deadlines, once per local day."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from alerts import services, tasks
from alerts.models import Digest
from forecasting.models import Forecast
from tests.alerts.fixtures import Mailbox, flag_raise
from tracker.models import Deadline, Project, Run

MORNING = datetime(2026, 5, 30, 9, 0, tzinfo=UTC)


def with_deadline_run(project: Project) -> Run:
    deadline = Deadline.objects.create(
        project=project,
        slug="blind-eval",
        name="blind eval",
        cutoff=MORNING + timedelta(days=6),
        buffer=timedelta(days=3),
    )
    run = Run.objects.create(
        project=project,
        public_id="post-train-1.0",
        deadline=deadline,
        total_steps=1000,
        last_step=250,
    )
    Forecast.objects.create(
        run=run,
        kind=Forecast.Kind.ETA,
        computed_at=MORNING,
        segment=0,
        input_last_step=250,
        finish_p50=(MORNING + timedelta(days=4)).timestamp(),
    )
    Forecast.objects.create(
        run=run,
        kind=Forecast.Kind.DEADLINE,
        computed_at=MORNING,
        segment=0,
        input_last_step=250,
        data={"p_on_time": 0.12},
    )
    return run


def test_it_emails_owners_a_digest_of_runs_against_deadlines(
    project: Project, mailbox: Mailbox, no_default_slack: None
) -> None:
    run = with_deadline_run(project)
    flag_raise(run, "deadline", onset_step=None)

    assert services.digests_send_due(now=MORNING) == 1

    [message] = mailbox.messages
    assert message["To"] == "owner@example.com"  # owners only, not members or viewers
    assert message["Subject"] == (
        "[Runcast] LLM pretraining daily digest 2026-05-30: 1 run, 1 likely late, 1 flagged"
    )
    text, html = mailbox.bodies(message)
    assert "post-train-1.0 (running, 25%): blind eval, train by 06-02 09:00 UTC" in text
    assert "P50 finish 06-03 09:00 UTC (in 4 days); chance on time 12%; likely late" in text
    assert "open flags: deadline" in text
    assert 'href="http://testserver/runs/llm/post-train-1.0/"' in html


def test_it_sends_one_digest_a_day_however_often_it_runs(
    project: Project, mailbox: Mailbox, no_default_slack: None, monkeypatch: Any
) -> None:
    with_deadline_run(project)

    services.digests_send_due(now=MORNING)
    services.digests_send_due(now=MORNING + timedelta(hours=1))
    tasks.send_digests()  # the real clock: a later day, or before the hour
    tasks.send_digests()

    days = list(Digest.objects.values_list("day", flat=True))
    assert len(mailbox.messages) == len(days)
    assert days.count(MORNING.date()) == 1


def test_it_waits_for_the_digest_hour_in_the_projects_timezone(
    project: Project, mailbox: Mailbox, no_default_slack: None
) -> None:
    with_deadline_run(project)
    Project.objects.filter(pk=project.pk).update(timezone="America/Los_Angeles")

    # 09:00 UTC is 02:00 in Los Angeles: too early.
    assert services.digests_send_due(now=MORNING) == 0
    assert services.digests_send_due(now=MORNING + timedelta(hours=7)) == 1


def test_a_project_whose_timezone_cannot_be_read_does_not_stop_the_others_digests(
    project: Project,
    other_project: Project,
    mailbox: Mailbox,
    no_default_slack: None,
    caplog: Any,
) -> None:
    # A zone the server's tzdata has since dropped (US/Pacific-New went in 2020b), on the
    # project the sweep takes first.
    assert project.pk < other_project.pk
    Project.objects.filter(pk=project.pk).update(timezone="US/Pacific-New")
    with_deadline_run(project)
    with_deadline_run(other_project)

    assert services.digests_send_due(now=MORNING) == 1

    assert [m["To"] for m in mailbox.messages] == ["outsider@example.com"]
    failed = [r.getMessage() for r in caplog.records if r.name == "runcast.sweeps"]
    assert failed == [
        "sweep: digest of project llm failed; the sweep goes on and the next one retries it"
    ]


def test_it_skips_projects_with_nothing_to_report(
    project: Project, mailbox: Mailbox, no_default_slack: None
) -> None:
    assert services.digests_send_due(now=MORNING) == 0
    assert mailbox.messages == [] and Digest.objects.count() == 0


def test_it_retries_a_failed_digest_on_the_next_tick(
    project: Project, mailbox: Mailbox, settings: Any, no_default_slack: None
) -> None:
    with_deadline_run(project)
    port = settings.EMAIL_PORT
    settings.EMAIL_PORT = 1

    assert services.digests_send_due(now=MORNING) == 0
    assert Digest.objects.get().status == Digest.Status.FAILED

    settings.EMAIL_PORT = port
    assert services.digests_send_due(now=MORNING + timedelta(hours=1)) == 1
    digest = Digest.objects.get()
    assert (digest.status, digest.tries) == (Digest.Status.SENT, 2)
    assert len(mailbox.messages) == 1


def test_it_does_not_rebuild_a_digest_already_sent_today(
    project: Project,
    mailbox: Mailbox,
    no_default_slack: None,
    django_assert_max_num_queries: Any,
) -> None:
    with_deadline_run(project)
    services.digests_send_due(now=MORNING)
    # projects, owners' addresses, today's digest: nothing per run.
    with django_assert_max_num_queries(3):
        assert services.digests_send_due(now=MORNING + timedelta(hours=1)) == 0


def test_its_query_count_does_not_grow_with_runs(project: Project) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from alerts.digest import digest_message

    def digest_queries(runs: int) -> int:
        for i in range(Run.objects.count(), runs):
            run = Run.objects.create(project=project, public_id=f"r{i}", total_steps=1000)
            for kind, data in (
                (Forecast.Kind.ETA, {}),
                (Forecast.Kind.DEADLINE, {"p_on_time": 0.5}),
            ):
                Forecast.objects.create(
                    run=run,
                    kind=kind,
                    computed_at=MORNING,
                    segment=0,
                    input_last_step=1,
                    finish_p50=MORNING.timestamp() + 3600,
                    data=data,
                )
        with CaptureQueriesContext(connection) as ctx:
            message = digest_message(project=project, now=MORNING)
        assert message is not None and f"r{runs - 1}" in message.text
        return len(ctx.captured_queries)

    few, many = digest_queries(5), digest_queries(50)
    assert many == few <= 5  # 152 for 50 runs when it read two forecasts per run
