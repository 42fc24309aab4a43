from __future__ import annotations

import numpy as np
import pytest

from forecasting import compute
from forecasting.estimators import thresholds as th
from tracker.services import SeriesIn, batch_ingest, from_epoch, run_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def forecast_run(project):
    run = run_start(
        project=project,
        public_id="r1",
        session="s",
        started_at=from_epoch(1.76e9),
        fields={"total_steps": 10_000},
    ).run
    steps = np.arange(2000)
    loss = 2.0 + 8.0 * (steps + 10.0) ** -0.3
    loss[-3:] = np.nan
    batch_ingest(
        run=run,
        session="s",
        seq=1,
        events=[],
        heartbeat=None,
        series=[SeriesIn("loss", steps, loss, 1.76e9 + steps.astype(float))],
    )
    compute.forecast_compute(run_id=run.pk, now=from_epoch(1.76e9 + 2000))
    return run


def test_it_returns_forecasts_and_open_flags(api, read_token, forecast_run):
    res = api("GET", "/runs/r1/forecast", read_token)
    assert res.status_code == 200, res.content
    body = res.json()
    eta = body["forecasts"]["eta"]
    # 8,000 steps left at one a second; the wall clock adds the downtime the prior expects.
    assert eta["data"]["compute_p50"] == pytest.approx(8_000, abs=80)
    assert 1.76e9 + 10_000 - 80 <= eta["finish_p50"] <= 1.76e9 + 10_000 + 800
    assert [f["kind"] for f in body["flags"]] == ["nan"]
    # The 2,000 s of history it logged before its first forecast, rebuilt, then the live one.
    assert len(body["eta_history"]) == th.ETA_BACKFILL_POINTS + 1
    assert body["eta_history"][-1][0] == pytest.approx(1.76e9 + 2000)


def test_it_needs_the_read_scope_and_hides_other_projects(
    api, write_token, other_project, forecast_run
):
    from tracker.services import token_create

    assert api("GET", "/runs/r1/forecast", write_token).status_code == 403
    theirs = token_create(project=other_project, name="r", scope="read")
    assert api("GET", "/runs/r1/forecast", theirs).status_code == 404
    assert api("GET", "/runs/r1/forecast", None).status_code == 401
