from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest
from django.utils import timezone

from forecasting import compute
from forecasting.conditions import Condition
from forecasting.estimators import thresholds as th
from forecasting.flags import flags_sync
from tests.dashboard.factories import ended_inside, episode, episode_recovered, make_run
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


def test_it_returns_the_runs_loss_episodes_open_or_closed(api, read_token, project):
    # Issue 22: once the run ended, its episodes were nowhere in the API (open flags only).
    run = make_run(project, "r1", points=10)
    now = timezone.now().replace(microsecond=0)  # the API writes milliseconds
    episode(run, now - timedelta(hours=3), kind="spike", onset=300, rollback=200.0, state="spiking")
    episode_recovered(run, now - timedelta(hours=2), kind="spike", onset=300)
    nan = Condition("nan", "Loss became NaN/Inf at step 1,800.", 1.0, 1800, {"rollback_step": 1600})
    flags_sync(run=run, conditions=[nan], kinds=(), now=now - timedelta(minutes=90))
    episode(run, now - timedelta(hours=1), state="spiking", ratio=80.0)
    episode(run, now - timedelta(minutes=59))  # escalated: diverged, 8.9x
    (*_, live) = api("GET", "/runs/r1/forecast", read_token).json()["loss_episodes"]
    assert (live["kind"], live["open"], live["state"], live["ratio"]) == (
        "regression",
        True,
        "diverged",
        8.9,
    )
    assert live["outcome"] is None and live["closed_at"] is None and live["closing"] is None
    ended_inside(run, now - timedelta(minutes=30))

    res = api("GET", "/runs/r1/forecast", read_token)
    assert res.status_code == 200, res.content
    spike, went_nan, regression = res.json()["loss_episodes"]
    assert spike["kind"] == "spike" and not spike["open"]
    assert (spike["state"], spike["outcome"]) == ("spiking", "recovered")
    assert (spike["onset_step"], spike["rollback_step"]) == (300, 200.0)
    assert spike["closing"].startswith("Loss recovered from the blow-up at step 300")
    assert (went_nan["kind"], went_nan["onset_step"], went_nan["rollback_step"]) == (
        "nan",
        1800,
        1600,
    )
    assert went_nan["state"] is None and went_nan["outcome"] == "not recovered"
    assert regression == {
        "kind": "regression",
        "open": False,
        "state": "diverged",
        "outcome": "not recovered",
        "onset_step": 2500,
        "rollback_step": 2400.0,
        "ratio": 8.9,
        "reference_level": 0.37,
        "opened_at": regression["opened_at"],
        "closed_at": regression["closed_at"],
        "explanation": "Loss diverged at step 2,500 and has not come back: 8.9x its level.",
        "closing": "The run finished with its loss 8.9x its level before it (~0.37): diverged"
        " at step 2,500 and never recovered.",
    }
    opened, closed = (datetime.fromisoformat(regression[k]) for k in ("opened_at", "closed_at"))
    assert (opened, closed) == (now - timedelta(hours=1), now - timedelta(minutes=30))


def test_a_flags_times_come_in_utc_as_every_time_the_api_gives(api, read_token, forecast_run):
    """A flag's explanation holds stamps (the clock rule); the API writes them in UTC."""
    from forecasting.estimators import formatting as fmt

    finish = 1.76e9 + 9000
    slip = Condition("slip", f"finish slipped to {fmt.stamp(finish)}", 1.0, None, {})
    now = from_epoch(1.76e9 + 2001)
    flags_sync(run=forecast_run, conditions=[slip], kinds=("slip",), now=now)
    body = api("GET", "/runs/r1/forecast", read_token).json()
    (said,) = [f["explanation"] for f in body["flags"] if f["kind"] == "slip"]
    assert said == f"finish slipped to {fmt.when(finish)}" and said.endswith(" UTC")
