"""The Content-Security-Policy in a real browser: every page works under it, with no violation.

Headless Chromium reports each blocked script, style or request as a console error; a page that
needed an inline script or an injected <style> would log one here (and, in use, break).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from alerts import services as alert_services
from tests.dashboard.realistic import seed
from tracker.models import Project, Run

# The seeded flags' alerts are dispatched in-process, so the alert history has rows to draw.
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.eager]

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is absent: browser tests need it", allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


class Watched:
    """A page whose CSP violations and script errors are collected."""

    def __init__(self, page: Any, base: str) -> None:
        self.page, self.base = page, base
        self.violations: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.violations.append(f"script error: {e}"))

    def _console(self, message: Any) -> None:
        text = message.text
        if message.type == "error" and "Content Security Policy" in text:
            self.violations.append(text)

    def visit(self, path: str) -> Any:
        response = self.page.goto(self.base + path)
        self.page.wait_for_load_state("networkidle")
        return response


def test_every_page_works_under_the_policy_without_a_violation(
    browser: Any, live_server: Any, owner: Any, project: Project
) -> None:
    owner.is_staff = owner.is_superuser = True  # the admin's pages too
    owner.save()
    seed(project, now=timezone.now())
    run = Run.objects.filter(project=project).order_by("pk").first()
    assert run is not None
    alert_services.channel_create(project=project, kind="email", name="lead", target="a@b.cd")
    ctx = browser.new_context()
    w = Watched(ctx.new_page(), live_server.url)

    response = w.visit("/login/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    w.page.fill("input[name=username]", "owner")
    w.page.fill("input[name=password]", "pw-owner-123")
    w.page.click("button[type=submit]")
    w.page.wait_for_url(f"{live_server.url}/")

    w.visit(f"/runs/{project.slug}/{run.public_id}/")
    # The charts drew: uPlot and our scripts ran under the policy.
    w.page.wait_for_selector("#charts[data-ready='1']", timeout=15_000)
    for path in (
        "/",
        f"/projects/{project.slug}/compare/?run={run.public_id}",
        f"/projects/{project.slug}/settings/",
        f"/projects/{project.slug}/alerts/",
        f"/projects/{project.slug}/alerts/channels/",
        f"/projects/{project.slug}/alerts/rules/",
        f"/projects/{project.slug}/deadlines/new/",
        "/account/password/",
        "/admin/",
        "/admin/tracker/run/",
        f"/admin/tracker/run/{run.pk}/change/",
        "/api/v1/docs",
    ):
        assert w.visit(path).status == 200, path
    # Swagger UI rendered the schema from its static bundle.
    w.page.wait_for_selector(".swagger-ui .opblock", timeout=15_000)
    ctx.close()
    assert w.violations == []


def test_an_injected_inline_script_is_blocked(
    browser: Any, live_server: Any, owner: Any, project: Project
) -> None:
    """The policy has teeth: an inline script (what an XSS would inject) does not run."""
    ctx = browser.new_context()
    w = Watched(ctx.new_page(), live_server.url)
    w.visit("/login/")
    ran = w.page.evaluate(
        """() => {
            window.injected = false;
            const s = document.createElement('script');
            s.textContent = 'window.injected = true';
            document.body.appendChild(s);
            return window.injected;
        }"""
    )
    ctx.close()
    assert ran is False
    assert any("script-src" in v for v in w.violations), w.violations
