from __future__ import annotations

import json
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import numpy as np

from forecasting.estimators.formatting import render_stamps
from forecasting.estimators.slip import detect_slip

DAY = 86400.0
T0 = datetime(2025, 5, 20, 8, 0, tzinfo=UTC).timestamp()


def test_too_few_forecasts() -> None:
    assert detect_slip(np.array([T0, T0 + 60]), np.array([T0 + DAY] * 2), now=T0 + 60) is None


def test_steady_finish_is_not_slipping() -> None:
    times = T0 + np.arange(0, 2 * DAY, 3600.0)
    finishes = np.full(times.size, T0 + 6 * DAY) + np.sin(np.arange(times.size)) * 600.0
    res = detect_slip(times, finishes, now=times[-1])
    assert res is not None and not res.slipping
    assert "steady" in res.explanation
    json.dumps(res.to_dict(), allow_nan=False)


def test_finish_moving_later_is_slipping() -> None:
    times = T0 + np.arange(0, 2 * DAY + 1, 3600.0)
    # P50 finish moves from 05-26 08:00 to 06-03 over two days.
    finishes = np.linspace(T0 + 6 * DAY, T0 + 14 * DAY + 3.667 * 3600, times.size)
    res = detect_slip(times, finishes, now=times[-1])
    assert res is not None and res.slipping
    assert res.amount_s > 7 * DAY
    assert render_stamps(res.explanation).startswith(
        "finish slipped from 05-26 08:00 UTC to 06-03 11:40 UTC over 2 days"
    )


def test_small_move_is_not_slipping() -> None:
    times = T0 + np.arange(0, DAY, 3600.0)
    finishes = np.linspace(T0 + 10 * DAY, T0 + 10 * DAY + 1800, times.size)  # 30 min of 9 days
    res = detect_slip(times, finishes, now=times[-1])
    assert res is not None and not res.slipping


def test_explanation_is_rendered_in_the_readers_zone() -> None:
    """The clock rule: the stored text holds stamps, not one zone's times; a message renders
    them in the project's zone, a page in the viewer's."""
    times = T0 + np.arange(0, DAY + 1, 3600.0)
    finishes = np.linspace(T0 + 2 * DAY, T0 + 4 * DAY, times.size)
    res = detect_slip(times, finishes, now=times[-1])
    assert res is not None
    assert "05-22 08:00 UTC" in render_stamps(res.explanation)
    assert "05-22 17:00 JST (UTC+9)" in render_stamps(res.explanation, ZoneInfo("Asia/Tokyo"))


def test_a_short_runs_slip_is_written_to_the_second() -> None:
    """A 10-minute run's slip of 2.5 min: minutes alone read "from 08:10 to 08:12 (+2 min)"."""
    times = T0 + np.arange(0, 61, 5.0)
    finishes = np.linspace(T0 + 600, T0 + 750, times.size)
    res = detect_slip(times, finishes, now=times[-1])
    assert res is not None and res.slipping
    assert render_stamps(res.explanation).startswith(
        "finish slipped from 05-20 08:10:00 UTC to 05-20 08:12:30 UTC over 1 min (+2 min 30 s)"
    )
