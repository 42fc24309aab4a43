"""The team's first hour in headless Chromium against a live server and a local SMTP server:
the documented bootstrap command, then only the web UI, to a project with two more members and
a token that a trainer logs a run with."""

from __future__ import annotations

import io
import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from tracker.models import Membership, Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]

if not Path(CHROMIUM).exists():
    pytest.skip(
        f"{CHROMIUM} is absent: browser tests need Debian's chromium", allow_module_level=True
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Playwright's sync API runs its own event loop; Django must allow ORM calls beside it.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def _page(browser: Any) -> Any:
    ctx = browser.new_context()
    page = ctx.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    return page


def _log_in(page: Any, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def test_a_team_goes_from_nothing_to_a_project_with_members_and_a_token(
    browser: Any, live_server: Any, mailbox: Any, settings: Any
) -> None:
    base = live_server.url
    settings.SITE_URL = base
    settings.RUNCAST_INVITE_EMAIL = True
    out = io.StringIO()
    call_command("runcast_bootstrap", "--admin", "alice", "--email", "a@example.com", stdout=out)
    assert f"Log in at:  {base}/login/" in out.getvalue()
    (password,) = re.findall(r"^Password:\s+(\S+)$", out.getvalue(), flags=re.M)

    alice = _page(browser)
    _log_in(alice, base, "alice", password)
    alice.click("#new-project")
    alice.fill("input[name=name]", "Vision models")
    alice.click("button:has-text('Create project')")
    alice.wait_for_url(f"{base}/projects/vision-models/settings/")

    # Bob is invited by email and joins through the link.
    alice.fill("#invite-form input[name=email]", "bob@example.com")
    alice.select_option("#invite-form select[name=role]", "member")
    alice.click("#invite-form button[type=submit]")
    assert "Invitation emailed to bob@example.com" in alice.inner_text("#invited")
    (message,) = mailbox.messages
    text, _ = mailbox.bodies(message)
    (link,) = re.findall(rf"{re.escape(base)}/invite/\S+/", text)
    bob = _page(browser)
    bob.goto(link)
    bob.fill("input[name=username]", "bob")
    bob.fill("input[name=password]", "bobs-passphrase-42")
    bob.fill("input[name=password_again]", "bobs-passphrase-42")
    bob.click("button:has-text('Create account and join')")
    bob.wait_for_url(f"{base}/projects/vision-models/settings/")
    assert "your role: member" in bob.inner_text("main")

    # Carol gets an account with a password Alice hands over.
    alice.goto(f"{base}/projects/vision-models/settings/")
    alice.fill("#account-form input[name=username]", "carol")
    alice.select_option("#account-form select[name=role]", "viewer")
    alice.click("#account-form button[type=submit]")
    carol_password = alice.inner_text("#new-account-password").strip()
    carol = _page(browser)
    _log_in(carol, base, "carol", carol_password)
    assert "Vision models" in carol.inner_text("main")

    # A token, and a trainer logs a run with it.
    alice.goto(f"{base}/projects/vision-models/settings/")
    alice.fill("form[action$='/tokens/'] input[name=name]", "trainer")
    alice.click("button:has-text('Create token')")
    token = alice.inner_text("#new-token-value").strip()
    request = urllib.request.Request(
        f"{base}/api/v1/runs",
        data=json.dumps({"id": "vit-1", "session": "s1", "total_steps": 100}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as res:
        assert res.status == 201

    roles = dict(
        Membership.objects.filter(project__slug="vision-models").values_list(
            "user__username", "role"
        )
    )
    assert roles == {"alice": "owner", "bob": "member", "carol": "viewer"}
    assert Run.objects.get(public_id="vit-1").project.slug == "vision-models"
    for page in (alice, bob, carol):
        assert page.errors == []
        page.context.close()
