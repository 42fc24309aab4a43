"""The compare page in Chromium when the key compared on is not logged by every chosen run: it
threw a TypeError (uPlot.join of no series) and drew nothing for a key no run has; it draws an
empty chart and says which runs do not log the key."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.dashboard.factories import T0, make_run
from tests.dashboard.test_browser import CHROMIUM, _shot, bare_page, browser, page  # noqa: F401
from tracker.services import SeriesIn, batch_ingest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The chart's series (x first) and how many points each draws.
DRAWN = """() => {
  const u = window.runcastCharts.compare;
  const n = (i) => (u.data[i] ? u.data[i].filter((v) => v != null).length : 0);
  return u.series.map((s, i) => [s.label, n(i)]);
}"""


def _compare(pg: Any, runs: list[str], key: str) -> None:
    query = "&".join(f"run={r}" for r in runs)
    pg.goto(f"{pg.base}/projects/llm/compare/?{query}&key={key}")
    pg.wait_for_selector("#chart-compare[data-ready='1']", timeout=15_000)


def test_a_key_no_run_logs_draws_an_empty_chart_that_says_so(
    bare_page: Any,  # noqa: F811
    project: Any,
) -> None:
    pg = bare_page
    make_run(project, "r1", points=600)
    make_run(project, "r2", points=600)

    _compare(pg, ["r1", "r2"], "nope")

    assert pg.evaluate(DRAWN) == [["step", 0]]
    assert pg.inner_text("#compare-note") == "No run logs nope."
    # The table still lists each chosen run and the key it was compared on.
    rows = pg.locator("#compare-table tbody tr")
    assert rows.count() == 2 and "nope" in rows.first.inner_text()
    _shot(pg, "compare-no-key")


def test_a_key_some_runs_log_draws_theirs_and_names_the_others(
    bare_page: Any,  # noqa: F811
    project: Any,
) -> None:
    pg = bare_page
    make_run(project, "r1", points=600)
    r2 = make_run(project, "r2", points=600)
    steps = np.arange(0, 600, 10, dtype=np.int64)
    batch_ingest(
        run=r2,
        session="s",
        seq=99,
        series=[SeriesIn("grad_norm", steps, np.ones(steps.size), T0 + steps / 2.0)],
        events=[],
        heartbeat=None,
    )

    _compare(pg, ["r1", "r2"], "grad_norm")

    drawn = dict(pg.evaluate(DRAWN))
    assert drawn["r2"] == 60 and "r1" not in drawn
    assert pg.inner_text("#compare-note") == "r1 does not log grad_norm."


def test_the_loss_forecast_is_drawn_only_on_the_key_it_forecasts(page: Any) -> None:  # noqa: F811
    """The dashed forecast is the run's loss forecast: over another key (or none) it drew a
    loss curve under that key's name."""
    pg = page
    runs = ["nanogpt-1b-scaleup", "dsv3-proxy"]

    _compare(pg, runs, "nope")
    assert pg.evaluate(DRAWN) == [["step", 0]]
    assert pg.inner_text("#compare-note") == "No run logs nope."

    _compare(pg, runs, "")
    labels = [label for label, n in pg.evaluate(DRAWN) if n]
    assert any(label.endswith(" forecast") for label in labels), labels
    assert pg.inner_text("#compare-note") == ""
