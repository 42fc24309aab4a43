"""The pages in headless Chromium against a live server with real curves (demo/data).

Screenshots go to artifacts/screenshots/ on every run; with RUNCAST_UPDATE_SCREENSHOTS=1 they
also replace docs/screenshots/board.png and run.png.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from tests.dashboard.realistic import seed
from tracker.models import ApiToken, Deadline, Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "screenshots"
DOCS = ROOT / "docs" / "screenshots"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]

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


@contextmanager
def _logged_in(browser: Any, live_server: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000}, timezone_id="Europe/Berlin")
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(f"{live_server.url}/login/")
    pg.fill("input[name=username]", "owner")
    pg.fill("input[name=password]", "pw-owner-123")
    pg.click("button[type=submit]")
    pg.wait_for_url(f"{live_server.url}/")
    pg.base = live_server.url
    yield pg
    ctx.close()
    assert errors == []


@pytest.fixture
def page(browser: Any, live_server: Any, owner: Any, project: Any) -> Iterator[Any]:
    seed(project, now=timezone.now())
    with _logged_in(browser, live_server) as pg:
        yield pg


@pytest.fixture
def bare_page(browser: Any, live_server: Any, owner: Any) -> Iterator[Any]:
    """Logged in, nothing seeded: the test builds the run it looks at."""
    with _logged_in(browser, live_server) as pg:
        yield pg


def _shot(pg: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    if os.environ.get("RUNCAST_UPDATE_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS / f"{name}.png")


def test_board_run_page_and_zoom(page: Any) -> None:
    pg = page
    lane = pg.locator("section.lane", has_text="Blind eval submission")
    assert lane.locator("td.run-cell").count() == 3
    assert lane.locator("i.bar").count() == 3
    assert "Asia/Shanghai" in lane.locator(".cutoff").inner_text()
    # The cutoff is also shown in the viewer's zone (Berlin here), formatted by the browser.
    assert "GMT+1" in lane.locator(".cutoff time").first.inner_text()
    _shot(pg, "board")

    pg.click("text=GPT-2 1.5B speedrun")
    pg.wait_for_selector("#charts[data-ready='1']", timeout=15_000)
    lengths = pg.evaluate(
        "() => Object.fromEntries(['loss','eta','rate','metric'].map("
        "k => [k, window.runcastCharts[k] ? window.runcastCharts[k].data[0].length : 0]))"
    )
    assert all(n > 0 for n in lengths.values()), lengths
    loss_points = pg.evaluate(
        "() => window.runcastCharts.loss.data[4].filter(v => v != null).length"
    )
    assert loss_points > 100
    _shot(pg, "run")

    before = pg.evaluate("() => window.runcastFetches.length")
    pg.evaluate(
        "() => { const u = window.runcastCharts.loss;"
        " u.setSelect({left: u.bbox.width / devicePixelRatio * 0.3, top: 0,"
        " width: u.bbox.width / devicePixelRatio * 0.05, height: 10}); }"
    )
    pg.wait_for_selector("#chart-loss[data-zoomed='1']", timeout=10_000)
    fetched = pg.evaluate("(n) => window.runcastFetches.slice(n)", before)
    assert any("series.json" in u and "x0=" in u for u in fetched), fetched
    # The envelope (not the forecast fan joined on the same x) now covers only the selection.
    xs = pg.evaluate(
        "() => { const d = window.runcastCharts.loss.data;"
        " return d[0].filter((x, i) => d[1][i] != null); }"
    )
    assert len(xs) > 10 and max(xs) - min(xs) < 0.2 * 11_200


def test_create_a_deadline_and_a_token(page: Any) -> None:
    pg = page
    pg.goto(f"{pg.base}/projects/llm/deadlines/new/")
    pg.fill("input[name=name]", "Camera ready")
    pg.fill("input[name=cutoff_local]", "2031-05-01T12:00")
    pg.select_option("select[name=timezone]", "America/Los_Angeles")
    pg.fill("input[name=buffer_hours]", "2")
    pg.click("button:has-text('Create deadline')")
    pg.wait_for_url(f"{pg.base}/projects/llm/settings/")
    d = Deadline.objects.get(slug="camera-ready")
    assert d.cutoff.isoformat() == "2031-05-01T19:00:00+00:00"  # PDT
    assert "2031-05-01 12:00 America/Los_Angeles" in pg.content()

    pg.fill("form[action$='/tokens/'] input[name=name]", "trainer-ci")
    pg.click("button:has-text('Create token')")
    token = pg.inner_text("#new-token-value")
    assert token.startswith("rc_")
    row = ApiToken.objects.get(name="trainer-ci")
    assert token.split("_")[1] == row.prefix and token not in row.hashed
    pg.goto(f"{pg.base}/projects/llm/settings/")
    assert token not in pg.content()


def test_it_renders_the_compare_key_and_run_names_as_text(page: Any) -> None:
    pg = page
    Run.objects.filter(public_id="dsv3-proxy").update(name="<img src=x onerror='window.pwned=2'>")
    evil = urllib.parse.quote("<img src=x onerror='window.pwned=1'>")
    pg.goto(f"{pg.base}/projects/llm/compare/?run=nanogpt-1b-scaleup&run=dsv3-proxy&key={evil}")
    pg.wait_for_selector("#compare-table td", timeout=15_000)
    assert pg.locator("#compare-table img").count() == 0
    assert pg.evaluate("() => window.pwned") is None
    assert "<img src=x onerror='window.pwned=1'>" in pg.inner_text("#compare-table")
