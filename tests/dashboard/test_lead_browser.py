"""What a lead reads on the run page, checked in headless Chromium (fixtures of test_browser)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.dashboard import factories
from tests.dashboard.realistic import forecasts_by_hand
from tests.dashboard.test_browser import CHROMIUM, bare_page, browser, page  # noqa: F401
from tests.dashboard.test_ranks_page import straggling  # noqa: F401
from tracker.models import Deadline, Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _charts_js(pg: Any) -> None:
    pg.goto(f"{pg.base}/projects/llm/settings/")
    pg.add_script_tag(url=f"{pg.base}/static/vendor/uPlot.iife.min.js")
    pg.add_script_tag(url=f"{pg.base}/static/dashboard/charts.js")


def test_step_labels_are_exact(bare_page: Any, project: Any) -> None:  # noqa: F811
    # The ranks axis of the demo read "10k 10.3k 10.5k 10.8k 11k" for ticks every 250 steps, and
    # a rollback checkpoint at step 12,250 would have been labelled "step 12.3k".
    pg = bare_page
    _charts_js(pg)
    steps = [900, 9750, 10_000, 10_250, 10_750, 12_345, 250_000, 1_234_560]
    ticks = pg.evaluate("(s) => window.Runcast.fmtStep(null, s)", steps)
    assert ticks == ["900", "9750", "10k", "10.25k", "10.75k", "12,345", "250k", "1234.56k"]
    texts = pg.evaluate("(s) => s.map(window.Runcast.stepText)", steps)
    assert texts == ["900", "9750", "10k", "10.25k", "10.75k", "12,345", "250k", "1234.56k"]


def _aimed_run(project: Any, now: Any) -> Any:
    """A running run aimed at a cutoff 3 h 10 min away (1 h buffer), ETAs 20 h and 1 min ago."""
    deadline = Deadline.objects.create(
        project=project,
        slug="eval",
        name="Eval",
        cutoff=now + timedelta(hours=3, minutes=10),
        timezone="UTC",
        buffer=timedelta(hours=1),
    )
    run = factories.make_run(project, "aimed", deadline=deadline)
    factories.forecast_set(run, now, finish_in=3 * 3600, p=0.6)
    return run


def test_eta_history_line_labels_leave_the_latest_forecast_visible(
    bare_page: Any,  # noqa: F811
    project: Any,
) -> None:
    # The cutoff and train-by labels sat at the right end of their lines, which is where the
    # latest forecast always is: "train by Fri, 04:22 GMT+1" covered the newest P50 and whisker.
    pg = bare_page
    run = _aimed_run(project, timezone.now())
    pg.goto(f"{pg.base}/runs/llm/{run.public_id}/")
    pg.wait_for_selector("#charts[data-ready='1']", timeout=15_000)
    got = pg.evaluate(
        "() => { const u = window.runcastCharts.eta; const n = u.data[0].length;"
        " return {x: u.valToPos(u.data[0][n - 1], 'x', true), px: devicePixelRatio,"
        "  lines: (u.runcastDrawn || []).filter((d) => d.kind === 'line')}; }"
    )
    assert len(got["lines"]) == 2, got
    margin = 8 * got["px"]  # the whisker's half width and a little air
    for line in got["lines"]:
        bx, _, bw, _ = line["box"]
        assert got["x"] < bx - margin or got["x"] > bx + bw + margin, (line, got["x"])


def test_an_ended_run_without_eta_forecasts_says_so(bare_page: Any, project: Any) -> None:  # noqa: F811
    # The demo's two runs replayed as already finished read "No ETA forecast yet: the run needs a
    # planned total and a few progress points" though they had both: they ended before one.
    pg = bare_page
    with forecasts_by_hand():
        run = factories.make_run(project, "short", total=1000)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, ended_at=timezone.now())
    pg.goto(f"{pg.base}/runs/llm/{run.public_id}/")
    pg.wait_for_selector("#charts[data-ready='1']", timeout=15_000)
    assert pg.inner_text("#info-eta") == "No ETA forecast: the run ended before one was made."


def test_board_figures_do_not_break_between_number_and_unit(page: Any) -> None:  # noqa: F811
    # The demo board at 1400 px read "slipped 5 min · ±9.7" with "h" alone on the next line.
    pg = page
    broken: list[str] = []
    for width in (1400, 1200):
        pg.set_viewport_size({"width": width, "height": 1000})
        pg.reload()
        pg.wait_for_selector("section.lane")
        broken += pg.evaluate(
            "() => [...document.querySelectorAll('.lane-table td .sub span')]"
            ".filter((s) => s.getClientRects().length > 1).map((s) => s.innerText)"
        )
    assert broken == []


def test_alert_tables_read_as_tables(bare_page: Any, project: Any) -> None:  # noqa: F811
    # The rules and channels tables were unstyled: headers centred over left-aligned cells, no
    # rules between rows (the only tables of the app without the plain table style).
    from alerts import services as alert_services
    from alerts.models import Channel

    alert_services.channel_create(
        project=project, kind=Channel.Kind.EMAIL, name="lead", target="lead@example.com"
    )
    pg = bare_page
    for name in ("rules", "channels"):
        pg.goto(f"{pg.base}/projects/llm/alerts/{name}/")
        aligns = pg.evaluate(
            "() => [...document.querySelectorAll('main table th')]"
            ".map((th) => getComputedStyle(th).textAlign)"
        )
        assert aligns and set(aligns) <= {"left", "start"}, (name, aligns)


def test_the_heat_map_of_a_few_ranks_leaves_no_blank_band(
    bare_page: Any,  # noqa: F811
    straggling: Any,  # noqa: F811
) -> None:
    # Eight ranks (and the demo's one) drew a 160-184 px heat map in a 250 px box: a blank band
    # between the step axis and the note under it.
    pg = bare_page
    pg.goto(f"{pg.base}/runs/llm/r1/")
    pg.wait_for_selector("#ranks-panel[data-ready='1']", timeout=20_000)
    box, plot = pg.evaluate(
        "() => [document.getElementById('chart-ranks').getBoundingClientRect().height,"
        " window.runcastCharts.ranks.root.getBoundingClientRect().height]"
    )
    assert box - plot <= 4, (box, plot)
