"""What a lead reads on the server-rendered pages: each number and sentence says what is so."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from alerts import selectors, services
from alerts.models import Channel
from tracker.models import Project


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
