"""What a lead reads on the server-rendered pages: each number and sentence says what is so."""

from __future__ import annotations

import re
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone

from alerts import selectors, services
from alerts.models import Channel, Notification
from forecasting.models import Flag
from tests.alerts.fixtures import flag_raise
from tests.dashboard import factories
from tracker.models import Project, Run
from tracker.project_settings.services import deadline_create


def _rules(client: Client, owner: User) -> str:
    client.force_login(owner)
    response = client.get("/projects/llm/alerts/rules/")
    assert response.status_code == 200
    return response.content.decode()


def test_rules_say_when_no_channel_would_receive_them(
    client: Client, owner: User, project: Project
) -> None:
    # The demo's rules page read "all enabled" on every rule with no channel at all: every alert
    # goes nowhere, and the page said the opposite.
    html = _rules(client, owner)
    assert "all enabled" not in html
    assert html.count("no channel enabled") == len(selectors.rule_rows(project=project))
    services.channel_create(
        project=project, kind=Channel.Kind.EMAIL, name="lead", target="lead@example.com"
    )
    html = _rules(client, owner)
    assert "no channel enabled" not in html and "all enabled" in html


def test_rules_give_the_cooldown_in_words(client: Client, owner: User, project: Project) -> None:
    # "1:00:00" (a Python timedelta) for the one-hour default.
    html = _rules(client, owner)
    assert "1:00:00" not in html
    assert "<td>1 h</td>" in html


def test_a_small_required_speedup_is_rounded_up(
    client: Client, owner: User, project: Project
) -> None:
    # The demo board read "89% · needs +0% speed" (0.4% more throughput rounded to nothing).
    now = timezone.now()
    deadline = deadline_create(
        project=project,
        name="Blind eval",
        slug="blind-eval",
        cutoff=now + timedelta(hours=8),
        timezone="UTC",
        buffer=timedelta(hours=1),
    )
    run = factories.make_run(project, "close", points=10, deadline=deadline)
    factories.forecast_set(run, now, finish_in=3600)
    factories.forecast(
        run,
        "deadline",
        now,
        p_on_time=0.89,
        speedup_for_p90=0.004,
        steps_cut_for_p90=12.0,
        explanation="89% likely on time",
    )
    client.force_login(owner)
    board = client.get("/").content.decode()
    card = client.get(f"/runs/llm/{run.public_id}/").content.decode()
    assert "needs +1% speed" in board and "+0%" not in board
    assert "For 90%: +1% throughput" in card


def test_pages_name_an_icon_that_exists(client: Client) -> None:
    # Without one, browsers asked /favicon.ico on every visit: a 404 in the demo's web log and
    # a failed request in the console.
    html = client.get("/login/").content.decode()
    found = re.search(r'<link rel="icon" href="([^"]+)"', html)
    assert found, "no icon link"
    href = found.group(1)
    assert href.startswith(settings.STATIC_URL), (href, settings.STATIC_URL)
    assert finders.find(href.split(settings.STATIC_URL, 1)[1]) is not None


def test_a_resolve_with_no_channel_says_there_is_no_channel(
    client: Client, owner: User, run: Run
) -> None:
    # The demo's history (no channel configured) noted each resolve "its raise was not
    # delivered on this channel (cooldown or failure)", beside a raise noted "no channel".
    services.rules_ensure_defaults(project=run.project)
    flag_raise(run, "nan")
    services.flags_dispatch()
    flag_raise(run, "nan", state=Flag.State.RESOLVED, explanation="nan cleared")
    services.flags_dispatch()
    notes = list(Notification.objects.filter(run=run).values_list("event", "reason"))
    assert [event for event, _ in notes].count("resolved") == 1, notes
    assert all(reason == services.NO_CHANNEL for _, reason in notes), notes
    client.force_login(owner)
    html = client.get("/projects/llm/alerts/").content.decode()
    assert "cooldown or failure" not in html
