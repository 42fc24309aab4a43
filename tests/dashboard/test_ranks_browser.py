"""The ranks panel in Chromium: the heat map draws the slow rank red, the slowest-ranks table
names it, a host drill-down redraws, and the throughput chart marks the straggler's onset."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dashboard.test_browser import CHROMIUM, _shot, bare_page, browser  # noqa: F401
from tests.dashboard.test_ranks_page import straggling  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

RED_AT_ROW = """(row) => {
  const u = window.runcastCharts.ranks, d = u.runcastHeatmap;
  const y = Math.round(u.valToPos(row, "y", true));
  const x = Math.round(u.valToPos(d.x[d.x.length - 2], "x", true));
  const px = u.ctx.getImageData(x, y, 1, 1).data;
  return {r: px[0], g: px[1], b: px[2], a: px[3], rows: d.rows};
}"""


def test_the_heat_map_shows_the_slow_rank_and_the_onset_is_on_the_throughput_chart(
    bare_page: Any,  # noqa: F811
    straggling: Any,  # noqa: F811
) -> None:
    pg = bare_page
    pg.goto(f"{pg.base}/runs/llm/r1/")
    pg.wait_for_selector("#ranks-panel[data-ready='1']", timeout=20_000)
    pg.wait_for_selector("#charts[data-ready='1']", timeout=20_000)
    slow = pg.evaluate(RED_AT_ROW, 5)
    fine = pg.evaluate(RED_AT_ROW, 1)
    assert slow["rows"][5] == "rank 5"
    # Rank 5 (30% slower) is a strong red; rank 1 (the median's pace) nearly transparent (the
    # canvas is see-through: a cell's strength is its alpha).
    assert slow["r"] > 150 and slow["g"] < 100 and slow["a"] > 150, slow
    assert fine["a"] < 60, fine
    # The heading counts the job's 64 GPUs; 8 send timings: the note says so ("8 ranks
    # reporting" under "64 ranks" read as a contradiction, and a lone rank read "1 ranks").
    info = pg.inner_text("#info-ranks")
    assert info.startswith("8 of 64 ranks reporting · steps"), info
    first = pg.inner_text("#slowest-ranks tbody tr:first-child")
    assert "rank 5" in first and "node-1" in first and "\t+" in first  # over the window
    drawn = pg.evaluate("() => window.runcastCharts.rate.runcastDrawn.map((d) => d.label)")
    assert any("straggler onset: rank 5 on node-1" in label for label in drawn), drawn
    assert "Without it: finish" in pg.inner_text("#straggler-card")
    _shot(pg, "run-ranks")

    pg.select_option("#ranks-host", "node-0")
    pg.wait_for_function(
        "() => window.runcastCharts.ranks.runcastHeatmap.rows[0] === 'rank 0'"
        " && window.runcastCharts.ranks.runcastHeatmap.rows.length === 4"
    )
