"""The pages in headless Chromium against a live server with real curves (demo/data).

Screenshots go to artifacts/screenshots/ on every run; with RUNCAST_UPDATE_SCREENSHOTS=1 they
also replace docs/screenshots/board.png and run.png.
"""

from __future__ import annotations

import importlib
import itertools
import os
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.utils import timezone

from tests.dashboard import factories
from tests.dashboard.realistic import forecasts_by_hand, seed
from tracker.models import ApiToken, Deadline, Run
from tracker.services import SeriesIn, batch_ingest, from_epoch, run_start

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
    # Only the README's two pictures go to docs/; the others are test fixtures' pages.
    if os.environ.get("RUNCAST_UPDATE_SCREENSHOTS") == "1" and name in ("board", "run"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS / f"{name}.png")


def test_board_run_page_and_zoom(page: Any) -> None:
    pg = page
    lane = pg.locator("section.lane", has_text="Blind eval submission")
    assert lane.locator("td.run-cell").count() == 3
    assert lane.locator("i.bar").count() == 3
    assert "Asia/Shanghai" in lane.locator(".cutoff").inner_text()
    # The cutoff is also shown in the viewer's zone (Berlin here), formatted by the browser.
    # Named with its offset (the clock rule): en-US Chromium has no letters for Berlin.
    assert lane.locator(".cutoff time").first.inner_text().endswith(" UTC+1")
    # The run at 0% on time carries its deadline flag (the replay reports as a live run does).
    late = lane.locator("tr", has_text="DeepSeek-V3 proxy")
    assert "deadline" in late.inner_text()
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
    for chart in ("loss", "eta", "rate"):
        pg.locator(f"#chart-{chart}").screenshot(path=str(ARTIFACTS / f"run-{chart}.png"))

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


# Tick labels that overlap a neighbour, and cells whose text is cut off (ellipsis or clipped).
BOARD_CROWDING_JS = """() => {
  const out = [];
  document.querySelectorAll(".axis").forEach((axis) => {
    const r = [...axis.querySelectorAll(".tick")].map((t) => t.getBoundingClientRect());
    for (let i = 1; i < r.length; i++) if (r[i].left < r[i - 1].right) out.push("ticks overlap");
  });
  const cells = ".lane-table td:not(.tl), .lane-table th:not(.tl-head)";
  document.querySelectorAll(cells).forEach((c) => {
    if (c.querySelector("a") || c.classList.contains("flags")) return;  // names truncate on purpose
    if (c.scrollWidth > c.clientWidth + 1) out.push("cut: " + c.innerText.replace(/\\s+/g, " "));
  });
  return out;
}"""


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


# --- issue 9: what the lead sees is exact -------------------------------------------------------

# Every labelled axis of every chart: its size against what its tick labels need (tick, gap and
# the widest label, measured in the axis font) so the title beside them cannot overlap them.
AXES_JS = """() => {
  const out = [];
  const px = devicePixelRatio || 1;
  const c = document.createElement("canvas").getContext("2d");
  for (const [name, u] of Object.entries(window.runcastCharts)) {
    u.axes.forEach((a, i) => {
      if (!a.show || a.label == null || !a._values) return;
      c.font = a.font[0];
      const lines = a._values.filter((v) => v != null).map((v) => String(v).split("\\n"));
      const w = Math.max(0, ...lines.flat().map((t) => c.measureText(t).width)) / px;
      const rows = Math.max(1, ...lines.map((l) => l.length));
      const tick = a.ticks.show ? a.ticks.size : 0;
      const need = a.side % 2 ? tick + a.gap + w : tick + a.gap + (a.font[1] / px) * 1.2 * rows;
      out.push({ chart: name, axis: i, label: a.label, size: a._size, need, values: a._values });
    });
  }
  return out;
}"""

# The labels a time axis built by Runcast.timeAxis() shows over spans from a minute to weeks.
TIME_TICKS_JS = """(spans) => Promise.all(spans.map(async (span) => {
  const el = document.createElement("div");
  document.body.appendChild(el);
  const t0 = Date.UTC(2031, 2, 3, 13, 2, 17) / 1000;
  const u = new uPlot({ width: 600, height: 150,
    scales: { x: { time: true, auto: false, range: [t0, t0 + span] } },
    axes: [window.Runcast.timeAxis(), { show: false }], series: [{}, {}] },
    [[t0, t0 + span], [1, 2]], el);
  await new Promise((r) => setTimeout(r, 0));  // uPlot draws after a microtask
  const vals = u.axes[0]._values.slice();
  u.destroy();
  el.remove();
  return vals;
}))"""

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# Every time names its zone with the offset: "UTC+1", "UTC", "CET (UTC+1)" (the clock rule).
ZONE = r"(UTC([+-]\d{1,2}(:\d\d)?)?|[A-Z]{2,5} \(UTC[+-]\d{1,2}(:\d\d)?\))$"


def _diverged_run(project: Any, now: Any) -> Run:
    """A run 50 min old: warmup+cosine lr peaking at 1e-3, a loss that goes NaN/Inf at steps
    900-911, its NaN flag (onset 900, rollback to 800) and a single ETA forecast."""
    start = now.timestamp() - 50 * 60
    with forecasts_by_hand():
        started = run_start(
            project=project,
            public_id="diverged",
            session="s",
            started_at=from_epoch(start),
            fields={"name": "Diverged", "total_steps": 3000, "world_size": 8},
        )
        steps = np.arange(1200, dtype=np.int64)
        times = start + 60 + steps * 2.0
        loss = 3.0 + np.exp(-steps / 300.0) + 0.05 * np.sin(steps / 7.0)
        loss[900:911] = np.nan
        loss[911] = np.inf
        lr = np.where(
            steps < 200, 1e-3 * steps / 200, 1e-3 * 0.5 * (1 + np.cos(np.pi * (steps - 200) / 2800))
        )
        batch_ingest(
            run=started.run,
            session="s",
            seq=1,
            series=[SeriesIn("loss", steps, loss, times), SeriesIn("lr", steps, lr, times)],
            events=[],
            heartbeat=from_epoch(times[-1]),
        )
    run = Run.objects.get(pk=started.run.pk)
    factories.forecast(run, "eta", now - timedelta(minutes=1), finish=now.timestamp() + 3600)
    factories.flag(run, "nan", onset=900, rollback_step=800)
    return run


def _open_run(pg: Any, run_id: str) -> None:
    pg.goto(f"{pg.base}/runs/llm/{run_id}/")
    pg.wait_for_selector("#charts[data-ready='1']", timeout=15_000)


def test_time_axes_read_well_from_a_minute_to_weeks(bare_page: Any, project: Any) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/projects/llm/settings/")
    pg.add_script_tag(url=f"{pg.base}/static/vendor/uPlot.iife.min.js")
    pg.add_script_tag(url=f"{pg.base}/static/dashboard/charts.js")
    spans = [60, 10 * 60, 3600, 6 * 3600, 86400, 3 * 86400, 21 * 86400]
    for span, labels in zip(spans, pg.evaluate(TIME_TICKS_JS, spans), strict=True):
        assert len(labels) >= 3, (span, labels)
        assert all(labels) and "00:00" not in labels, (span, labels)
        # Neighbours differ (a 12:00 between two dates is fine; a row of the same label is not).
        assert all(a != b for a, b in itertools.pairwise(labels)), (span, labels)
        if span <= 60:
            assert any(":" in t and len(t.split(" ")[-1]) == 8 for t in labels), labels  # seconds
        if span >= 7 * 86400:  # dates, not a row of "00:00"
            assert all(any(d in t for d in DAYS) for t in labels), labels
        elif span >= 86400:
            assert any(any(d in t for d in DAYS) for t in labels), labels


def test_eta_history_starts_at_the_run_start_and_shows_one_forecast(
    bare_page: Any, project: Any
) -> None:
    pg = bare_page
    run = _diverged_run(project, timezone.now())
    _open_run(pg, run.public_id)
    eta = pg.evaluate(
        "() => { const u = window.runcastCharts.eta;"
        " const x = u.valToPos(u.data[0][0], 'x', true), y = u.valToPos(u.data[2][0], 'y', true);"
        " const px = u.ctx.getImageData(Math.round(x) - 4, Math.round(y) - 4, 9, 9).data;"
        " let blue = 0; for (let i = 0; i < px.length; i += 4)"
        "   if (px[i] < 80 && px[i + 1] < 120 && px[i + 2] > 110) blue++;"
        " return {min: u.scales.x.min, max: u.scales.x.max, n: u.data[0].length, blue,"
        "         at: u.data[0][0], xs: u.axes[0]._values, ys: u.axes[1]._values,"
        "         inside: x > u.bbox.left + 20 && x < u.bbox.left + u.bbox.width - 4}; }"
    )
    assert eta["n"] == 1
    assert abs(eta["min"] - run.started_at.timestamp()) < 1, eta
    assert eta["inside"] and eta["blue"] >= 12, eta  # the one forecast is a visible dot
    for labels in (eta["xs"], eta["ys"]):
        assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    _shot(pg, "run-single-forecast")
    pg.locator("#chart-eta").screenshot(path=str(ARTIFACTS / "run-single-forecast-eta.png"))


@pytest.fixture
def diverged(bare_page: Any, project: Any) -> Any:
    """The run page of _diverged_run, charts drawn."""
    run = _diverged_run(project, timezone.now())
    _open_run(bare_page, run.public_id)
    return bare_page


def test_nan_steps_and_the_divergence_onset_are_drawn_and_labelled(diverged: Any) -> None:
    pg = diverged
    drawn = pg.evaluate(
        "() => { const u = window.runcastCharts.loss;"
        " const b = u.bbox;"
        " return {marks: u.runcastDrawn, bbox: [b.left, b.top, b.width, b.height],"
        "  x900: u.valToPos(900, 'x', true), px: devicePixelRatio}; }"
    )
    marks = {m["kind"]: m for m in drawn["marks"] or []}
    assert {"nonfinite", "onset", "rollback"} <= set(marks), drawn["marks"]
    assert abs(marks["nonfinite"]["x"] - drawn["x900"]) <= 2 * drawn["px"], drawn
    assert "NaN" in marks["nonfinite"]["label"] and "900" in marks["onset"]["label"]
    # Twelve NaN/Inf steps: the note under the chart counts them, then names the first eight
    # (it listed eight with no count, beside a chart label of 12 NaN/Inf).
    assert "NaN/Inf at 12 steps, first 900, 901," in pg.inner_text("#info-loss")
    left, top, width, height = drawn["bbox"]
    labelled = [m for m in drawn["marks"] if m.get("box")]
    for m in labelled:  # every label inside the plot, none over another
        x, y, w, h = m["box"]
        assert left <= x and x + w <= left + width and top <= y and y + h <= top + height, m
    for i, a in enumerate(labelled):
        for b in labelled[i + 1 :]:
            ax, ay, aw, ah = a["box"]
            bx, by, bw, bh = b["box"]
            assert ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay, (a, b)
    red = pg.evaluate(
        "([x, top, h]) => { const px = window.runcastCharts.loss.ctx.getImageData("
        " Math.round(x) - 1, top, 3, h).data; let n = 0;"
        " for (let i = 0; i < px.length; i += 4) if (px[i] > 150 && px[i + 1] < 90) n++;"
        " return n; }",
        [marks["onset"]["x"], int(top), int(height)],
    )
    assert red > height, red  # a solid line, not a faint hairline
    _shot(pg, "run-diverged")
    pg.locator("#chart-loss").screenshot(path=str(ARTIFACTS / "run-diverged-loss.png"))


def test_small_values_get_distinct_ticks(diverged: Any) -> None:
    pg = diverged
    pg.select_option("#metric-key", "lr")
    pg.wait_for_function(
        "() => window.runcastCharts.metric && window.runcastCharts.metric.series[3].label === 'lr'"
    )
    axis = pg.evaluate(
        "() => { const a = window.runcastCharts.metric.axes[1];"
        " return {values: a._values, splits: a._splits, incr: a._found[0]}; }"
    )
    labels = axis["values"]
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    for text, split in zip(labels, axis["splits"], strict=True):
        assert abs(float(text) - split) <= 0.01 * axis["incr"], (text, split)
    assert any("e-4" in t for t in labels), labels
    pg.locator("#chart-metric").screenshot(path=str(ARTIFACTS / "run-diverged-lr.png"))


def test_axis_titles_clear_their_tick_labels(diverged: Any) -> None:
    axes = diverged.evaluate(AXES_JS)
    assert {a["label"] for a in axes} >= {"step", "steps/s", "ms/step"}, axes
    for a in axes:
        assert a["size"] >= a["need"] + 3, a


def test_every_time_on_the_run_page_names_its_zone(diverged: Any) -> None:
    pg = diverged
    times = pg.locator("time[data-fmt]").all_inner_texts()
    assert len(times) >= 4 and all(re.search(ZONE, t.strip()) for t in times), times
    # And the chart's own times, in the same words (Berlin here: UTC+1; en-US says GMT+1).
    assert "UTC+1" in pg.inner_text("#info-eta") and "GMT" not in pg.inner_text("#info-eta")
    assert pg.evaluate("() => window.runcastCharts.eta.axes[0].label").endswith("(UTC+1)")


def test_a_framework_config_is_a_short_table_that_unfolds(bare_page: Any, project: Any) -> None:
    # The HF callback sends every TrainingArguments field and the model config: printed as one
    # dict per row, the Config panel was ~3,000 px tall.
    from tests.dashboard.test_run_page import LAST_CONFIG_KEY, hf_like_config

    run = _diverged_run(project, timezone.now())
    Run.objects.filter(pk=run.pk).update(config=hf_like_config())
    pg = bare_page
    _open_run(pg, run.public_id)
    panel = pg.locator("section.panel", has=pg.locator("h3", has_text="Config"))
    assert panel.bounding_box()["height"] < 700, panel.bounding_box()
    key = panel.locator("th", has_text=LAST_CONFIG_KEY)
    assert not key.is_visible()
    panel.locator("details.config-more > summary").click()
    assert key.is_visible()
    # Unfolded, each row is one line or two: long keys wrap in their cell, not the page.
    assert pg.evaluate("() => document.documentElement.scrollWidth") <= 1600
    rows = panel.locator("details.config-more tr")
    assert max(rows.nth(i).bounding_box()["height"] for i in range(rows.count())) < 60
    _shot(pg, "run-config")


# The board's columns, in order (a lane without a cutoff leaves "On time" unheaded).
COLUMNS = ["Run", "timeline", "On time", "Finish", "Progress", "Throughput", "Loss", "Flags"]
COLUMNS.append("Cost")
# Each board row's cells: its column, where it sits, and whether its text is cut (content
# wider than the cell, or a name clamped).
BOARD_CELLS_JS = """(columns) => [...document.querySelectorAll(".lane-table")].map((t) => {
  return [...t.querySelectorAll("tbody tr")].map((tr) => [...tr.children].map((td, i) => {
    const r = td.getBoundingClientRect(), a = td.querySelector(".run-cell a");
    return {
      col: columns[i], left: r.left, right: r.right, width: r.width,
      shown: getComputedStyle(td).display !== "none" && r.width > 0,
      cut: td.scrollWidth > td.clientWidth + 1 || (a ? a.scrollHeight > a.clientHeight + 1 : false),
      text: td.innerText.replace(/\\s+/g, " ").slice(0, 60),
    };
  }));
}).flat()"""

IMPORTANT = ("Run", "On time", "Finish", "Throughput", "Loss", "Flags", "Cost")


def _board_at(pg: Any, width: int) -> list[list[dict[str, Any]]]:
    pg.set_viewport_size({"width": width, "height": 1000})
    pg.reload()
    pg.wait_for_selector("section.lane")
    return pg.evaluate(BOARD_CELLS_JS, COLUMNS)


@pytest.fixture
def demo_named(page: Any) -> Any:
    """The seeded board with the demo's own run names (demo/replay.py), long as they are."""
    from tests.dashboard.realistic import PLANS

    # demo/ is a folder of scripts, not a package mypy maps: imported by name at run time.
    demo_plans = importlib.import_module("demo.replay").PLANS
    for ours, demo in zip(PLANS, demo_plans, strict=True):
        Run.objects.filter(public_id=ours.run_id).update(name=demo.name)
    return page


@pytest.mark.parametrize("width", [800, 1000, 1250])
def test_the_boards_important_columns_fit_a_narrow_window(demo_named: Any, width: int) -> None:
    # At 800 px each lane scrolled sideways on its own, with Throughput, Loss, Flags and Cost
    # off-screen: the less important columns give way instead (the timeline, then Progress,
    # which stacks under the name). Squeezing them instead had cut the on-time chance to "8…"
    # and piled the day ticks on each other ("Fri, Dec 4Sat, Dec 5Sun, ...").
    pg = demo_named
    rows = _board_at(pg, width)
    _shot(pg, f"board-{width}")
    assert rows
    for row in rows:
        shown = {c["col"]: c for c in row if c["shown"]}
        for col in IMPORTANT:
            cell = shown.get(col)
            assert cell is not None, (col, row)
            assert cell["left"] >= 0 and cell["right"] <= width, cell
            assert cell["width"] >= 48, cell
    lanes = pg.evaluate(
        "() => [...document.querySelectorAll('section.lane')]"
        ".map((l) => l.scrollWidth - l.clientWidth)"
    )
    assert max(lanes) <= 1, lanes  # no lane scrolls sideways
    assert pg.evaluate("() => document.documentElement.scrollWidth") <= width
    assert pg.evaluate(BOARD_CROWDING_JS) == []


def test_the_board_gives_run_names_the_room_a_wide_window_has(demo_named: Any) -> None:
    # At 1,400 px "DeepSeek-V3 proxy convergence (Megatron, H100)" was cut to "DeepSeek-V3 pr…"
    # with room to spare in the row.
    pg = demo_named
    rows = _board_at(pg, 1400)
    _shot(pg, "board-1400")
    for row in rows:
        name = next(c for c in row if c["col"] == "Run")
        assert not name["cut"], name
        shown = [c["col"] for c in row if c["shown"]]
        assert "timeline" in shown and "Progress" in shown, shown  # everything, when it fits


def test_flag_texts_are_written_in_the_viewers_zone(bare_page: Any, project: Any) -> None:
    """The clock rule: a flag's text holds stamps, the viewer's browser (Berlin here) writes
    them in its zone with the offset, in the text and in the board's hover, not the project's
    (Shanghai's "CST (UTC+8)" beside the viewer's CET)."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from forecasting.estimators import formatting as fmt
    from tests.alerts.fixtures import flag_raise

    project.timezone = "Asia/Shanghai"
    project.save(update_fields=["timezone"])
    run = factories.make_run(project, "slipping", points=600)
    t = float(int(timezone.now().timestamp()) + 3600 + 7)
    text = f"ETA slipping: finish slipped to {fmt.stamp(t, seconds=True)}"
    flag_raise(run, "slip", explanation=text, data={"amount_s": 3600.0})
    berlin = datetime.fromtimestamp(t, ZoneInfo("Europe/Berlin"))
    offset = fmt.zone_name(berlin).split("(")[-1].rstrip(")")  # "UTC+1" (or +2 in summer)
    pg = bare_page
    _open_run(pg, run.public_id)
    shown = pg.locator(".flags-card time").first.inner_text()
    assert shown.endswith(f"{berlin:%H:%M:%S} {offset}"), shown
    assert "CST" not in pg.inner_text("body") and "\u27e6" not in pg.inner_text("body")
    pg.goto(f"{pg.base}/")
    title = pg.locator("td.flags .chip", has_text="slip").first.get_attribute("title")
    assert title is not None and f"{berlin:%H:%M:%S} {offset}" in title, title
