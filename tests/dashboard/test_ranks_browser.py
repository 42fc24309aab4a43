"""The ranks panel in Chromium: the heat map draws the slow rank red, the slowest-ranks table
names it, a host drill-down redraws, and the throughput chart marks the straggler's onset."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.dashboard.test_browser import CHROMIUM, _shot, bare_page, browser  # noqa: F401
from tests.dashboard.test_ranks_page import straggling  # noqa: F401
from tests.forecasting.test_services import healthy_loss, make_run, send
from tracker.services import RankTimingsIn, rank_timings_ingest

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


ALL_CELLS = """() => {
  const u = window.runcastCharts.ranks, d = u.runcastHeatmap, out = [];
  d.rows.forEach((_, row) => d.x.forEach((x, i) => {
    if (d.values[row][i] == null) return;
    const px = u.ctx.getImageData(Math.round(u.valToPos(x, "x", true)),
                                  Math.round(u.valToPos(row, "y", true)), 1, 1).data;
    out.push({row, v: d.values[row][i], r: px[0], g: px[1], b: px[2], a: px[3]});
  }));
  return out;
}"""


@pytest.mark.parametrize("ranks", [1, 4])
def test_a_lone_rank_or_equal_ranks_are_not_tinted_slower(
    bare_page: Any,  # noqa: F811
    project: Any,
    ranks: int,
) -> None:
    # One rank is its own median (1.0 in every cell); so is each of equal ranks. The map drew
    # them faint red ("slower") beside a table saying +0%.
    run = make_run(project, run_id="solo")
    steps = np.arange(0, 400)
    send(run, steps, healthy_loss(steps), seq=1)
    for rank in range(ranks):
        for first in range(0, 400, 20):
            block = np.arange(first, first + 20)
            rank_timings_ingest(
                run=run,
                session=f"rank-{rank}",
                seq=first // 20 + 1,
                timings=RankTimingsIn(
                    rank=rank,
                    local_rank=rank,
                    host="node-0",
                    steps=block,
                    compute=np.full(block.size, 0.8),
                    wait=np.full(block.size, 0.2),
                    total=np.full(block.size, np.nan),
                ),
            )
    pg = bare_page
    pg.goto(f"{pg.base}/runs/llm/solo/")
    pg.wait_for_selector("#ranks-panel[data-ready='1']", timeout=20_000)
    cells = pg.evaluate(ALL_CELLS)
    assert cells and all(c["v"] == 1 for c in cells), cells[:5]
    # No tint: see-through (a grid line behind a cell is grey, r = g = b), never red or blue.
    tinted = [c for c in cells if c["a"] > 0 and max(c["r"], c["b"]) - c["g"] > 30]
    assert tinted == [], tinted[:5]
    assert pg.inner_text("#slowest-ranks tbody tr:first-child").endswith("+0%")
