"""Forecast retention: what pages, slip and the hysteresis read stays; the rest is thinned."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import QuerySet
from django.test import override_settings

from forecasting import compute, conditions, retention, selectors, tasks
from forecasting.models import ConditionReading, Forecast
from tests.forecasting.test_services import at, make_run
from tracker.models import Run

pytestmark = pytest.mark.django_db

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
SPAN = 9 * DAY  # nine days of a run
EVERY = 5 * MINUTE  # one computation per 5 minutes (the real cadence is 15 s: fewer rows here)
NOW = SPAN
TIMES = range(0, int(SPAN) + 1, int(EVERY))


def _finish(t: float) -> float:
    # Steady at day 11 for seven days, then slipping a day over the last two.
    return 11 * DAY + max(0.0, t - 7 * DAY) / 2


def _history(run: Run) -> None:
    rows, readings = [], []
    for i, t in enumerate(TIMES):
        base = {"run": run, "segment": run.current_segment, "computed_at": at(t)}
        p50 = 1.76e9 + _finish(t)
        rows.append(
            Forecast(
                **base,
                kind="eta",
                input_last_step=i,
                finish_p10=p50 - HOUR,
                finish_p50=p50,
                finish_p90=p50 + HOUR,
                data={"rate_steps_per_s": 1.0},
            )
        )
        rows.append(Forecast(**base, kind="loss", input_last_step=i, data={"key": "loss"}))
        found = ["rise"] if t > SPAN - 2 * HOUR else []
        readings.append(ConditionReading(**base, second=int(1.76e9 + t), found=found))
    Forecast.objects.bulk_create(rows, batch_size=2000)
    ConditionReading.objects.bulk_create(readings, batch_size=2000)


def _kept_before(cutoff: float) -> int:
    """Forecasts a thinning at `cutoff` keeps before it: the newest of each clock hour, and the
    run's first (which is not the newest of its hour)."""
    return len({int((1.76e9 + t) // HOUR) for t in TIMES if t < cutoff}) + 1


@pytest.fixture
def run(project):
    run = make_run(project, total=10**6)
    _history(run)
    return run


def _count(run: Run, kind: str, since: float | None = None, until: float | None = None) -> int:
    rows: QuerySet[Any] = (
        ConditionReading.objects.filter(run=run)
        if kind == "conditions"  # the hysteresis' readings
        else Forecast.objects.filter(run=run, kind=kind)
    )
    if since is not None:
        rows = rows.filter(computed_at__gte=at(since))
    if until is not None:
        rows = rows.filter(computed_at__lt=at(until))
    return rows.count()


def test_it_keeps_the_window_and_one_forecast_per_hour_before_it(run):
    in_window = _count(run, "eta", since=NOW - 7 * DAY)
    result = retention.forecasts_thin(now=at(NOW))
    assert result.done
    assert _count(run, "eta", since=NOW - 7 * DAY) == in_window  # untouched
    # Two days before the window: one per hour, plus the run's very first forecast.
    kept = _kept_before(NOW - 7 * DAY)
    assert kept in (49, 50)  # 48 hours, cut at clock hours, and the first
    assert _count(run, "eta", until=NOW - 7 * DAY) == _count(run, "loss", until=NOW - 7 * DAY)
    assert _count(run, "eta", until=NOW - 7 * DAY) == kept
    first = Forecast.objects.filter(run=run, kind="eta").order_by("computed_at").first()
    assert first is not None and first.computed_at == at(0)
    # The flags' working rows: the last day only.
    assert _count(run, "conditions") == _count(run, "conditions", since=NOW - DAY) == 289
    old = len([t for t in TIMES if t < NOW - 7 * DAY])
    assert result.thinned == 2 * (old - kept)
    assert result.conditions == len(TIMES) - 289
    # Idempotent: a second pass finds nothing more to do.
    again = retention.forecasts_thin(now=at(NOW))
    assert (again.thinned, again.conditions) == (0, 0)


def test_slip_and_hysteresis_decide_the_same_after_thinning(run):
    slip_before = compute._slip_condition(run=run, now=at(NOW))
    assert slip_before and slip_before[0].kind == "slip"  # the history does slip
    rise = conditions.Condition("rise", "Loss has been rising", 9.0, 100.0)
    # Even an operator's too-short window keeps what slip reads (at least 4 days).
    with override_settings(RUNCAST_FORECAST_FULL_DAYS=0.5, RUNCAST_CONDITIONS_KEEP_HOURS=0.1):
        retention.forecasts_thin(now=at(NOW))
    assert _count(run, "eta", until=NOW - 4 * DAY) == _kept_before(NOW - 4 * DAY)
    slip_after = compute._slip_condition(run=run, now=at(NOW))
    assert [c.__dict__ for c in slip_after] == [c.__dict__ for c in slip_before]
    # Two hours of "rise" in every computation: the hysteresis still holds it after thinning.
    held = compute._sustained(run=run, found=[rise], odds=None, now=at(NOW + MINUTE))
    assert [c.kind for c in held] == ["rise"]


def test_the_run_page_shows_the_same_eta_history(client, member, run):
    client.force_login(member)
    url = f"/runs/{run.project.slug}/{run.public_id}/overview.json"
    before = client.get(url).json()["eta_history"]
    api_before = selectors.eta_history(run=run)
    retention.forecasts_thin(now=at(NOW))
    after = client.get(url).json()["eta_history"]
    assert len(before) == 2000 and after == before  # the chart's newest 2,000: ~7 days here
    # The API's history (every ETA forecast) keeps all of the window and thins what is older.
    api_after = selectors.eta_history(run=run)
    inside = [h for h in api_before if h[0] >= 1.76e9 + NOW - 7 * DAY]
    assert api_after[-len(inside) :] == inside
    assert len(api_after) == len(inside) + _kept_before(NOW - 7 * DAY)


def test_an_ended_runs_last_forecast_of_each_kind_stays(run):
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, ended_at=at(NOW))
    latest = {k: selectors.forecast_latest(run=run, kind=k) for k in ("eta", "loss")}
    retention.forecasts_thin(now=at(NOW + 60 * DAY))  # two months later
    assert _count(run, "eta") == _kept_before(SPAN + 1)  # hourly, and the first
    for kind, forecast in latest.items():
        assert selectors.forecast_latest(run=run, kind=kind) == forecast


@pytest.mark.eager
def test_the_task_runs_twice_safely(run):
    tasks.forecasts_thin.delay()
    tasks.forecasts_thin.delay()
    # The task uses the wall clock: the synthetic run lies years back, all of it beyond 7 days.
    assert _count(run, "conditions") == 0
    assert _count(run, "eta") == Forecast.objects.filter(run=run, kind="loss").count() > 0
    assert _count(run, "eta") == _kept_before(SPAN + 1)
    assert timedelta(seconds=retention.windows()[1]) == timedelta(hours=1)
