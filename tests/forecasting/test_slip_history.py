"""The slip detector reads a bounded set of forecasts (selectors.slip_history) and answers as it
did over every live ETA forecast of the window."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.db import connection

from forecasting import selectors
from forecasting.estimators import thresholds as th
from forecasting.estimators.slip import detect_slip
from forecasting.models import Forecast
from tracker.services import from_epoch, run_start

pytestmark = pytest.mark.django_db

T0 = 1.76e9


def full_answer(run, now: float):
    """detect_slip over every live forecast of the window, read as the forecast read them before
    (the first, and every one of the last SLIP_WINDOW_MAX_S)."""
    etas = Forecast.objects.filter(
        run=run, kind=Forecast.Kind.ETA, finish_p50__isnull=False
    ).exclude(data__has_key="as_of_history")
    at = datetime.fromtimestamp(now, tz=UTC)
    first = etas.order_by("computed_at").values_list("computed_at", "finish_p50").first()
    recent = list(
        etas.filter(computed_at__gte=at - timedelta(seconds=th.SLIP_WINDOW_MAX_S))
        .order_by("computed_at")
        .values_list("computed_at", "finish_p50")
    )
    history = ([first] if first is not None and first not in recent[:1] else []) + recent
    if len(history) < 2:
        return None
    t = np.array([h[0].timestamp() for h in history])
    f = np.array([h[1] for h in history])
    return detect_slip(t, f, now=now)


def bounded_answer(run, now: float):
    history = selectors.slip_history(run=run, now=datetime.fromtimestamp(now, tz=UTC))
    if len(history) < 2:
        return None
    t = np.array([h[0].timestamp() for h in history])
    f = np.array([h[1] for h in history])
    return detect_slip(t, f, now=now)


def make_run(project, public_id: str):
    return run_start(
        project=project, public_id=public_id, session="s", started_at=from_epoch(T0), fields={}
    ).run


def store(run, rows: list[tuple[float, float]], *, as_of: int = 0) -> None:
    Forecast.objects.bulk_create(
        Forecast(
            run=run,
            kind=Forecast.Kind.ETA,
            computed_at=datetime.fromtimestamp(t, tz=UTC),
            segment=1,
            input_last_step=i,
            finish_p50=f,
            data={"as_of_history": True} if i < as_of else {},
        )
        for i, (t, f) in enumerate(rows)
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_bounded_history_gives_the_same_slip_as_every_forecast(project, seed):
    rng = random.Random(seed)
    run = make_run(project, f"r{seed}")
    n = rng.choice([1, 2, 3, 5, 40, 600])
    step = rng.choice([15.0, 60.0, 900.0])
    finish = T0 + rng.uniform(600, 5 * 86400)
    rows = []
    for i in range(n):
        t = T0 + i * step + (0 if rng.random() < 0.2 and rows else rng.uniform(0, 5))
        if rows and rng.random() < 0.1:
            t = rows[-1][0]  # two forecasts in one second
        # A finish that wanders, slips, holds its lowest twice, now and then not finite.
        finish += rng.choice([0.0, 0.0, rng.uniform(-300, 300), rng.uniform(0, 7200)])
        f = finish
        if rng.random() < 0.03 and connection.vendor == "postgresql":
            f = rng.choice([math.inf, -math.inf, math.nan])
        rows.append((t, f))
    as_of = rng.choice([0, 0, min(3, n)])
    store(run, rows, as_of=as_of)
    end = rows[-1][0]
    for now in (end, end + 1.0, end - step * n / 2, end + 4 * 86400):
        got = bounded_answer(run, now)
        want = full_answer(run, now)
        assert (got is None) == (want is None), now
        if got is not None:
            assert got.to_dict() == want.to_dict(), now


def test_it_reads_a_few_rows_however_long_the_run_was_watched(
    project, django_assert_max_num_queries
):
    run = make_run(project, "long")
    rows = [(T0 + 15.0 * i, T0 + 86400 * 5 + 0.5 * i) for i in range(20_000)]  # 3.5 days
    store(run, rows)
    now = datetime.fromtimestamp(rows[-1][0], tz=UTC)
    with django_assert_max_num_queries(4):
        history = selectors.slip_history(run=run, now=now)
    assert len(history) <= 6
    assert history[0][0] == datetime.fromtimestamp(T0, tz=UTC)
    assert history[-1][0] == now
    assert timedelta(0) < history[-1][0] - history[-2][0] <= timedelta(seconds=15)
