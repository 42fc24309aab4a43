"""The time axis's labels: how many a window gets wherever it falls on the clock."""

from __future__ import annotations

import pytest

from dashboard.presenters import HOST_TICK_STEPS, KEEP_LABELS_BEFORE, MAX_TICKS, time_ticks


@pytest.mark.parametrize("minutes", [7, 10, 15, 20, 30, 45, 60, 90, 120, 240, 360, 720, 1440])
def test_every_host_window_gets_three_to_max_labels_wherever_it_starts(minutes: int) -> None:
    width = minutes * 60.0
    # Every phase against the spacings (a 15-minute window ending just past a 5-minute mark
    # once lost its last label to the lane's edge and showed two).
    for offset in range(0, 3600, 7):
        start = 1_796_478_905.0 + offset
        ticks = time_ticks(start, start + width, HOST_TICK_STEPS)
        assert 3 <= len(ticks) <= MAX_TICKS, (minutes, offset, [t.epoch for t in ticks])
        step = ticks[1].epoch - ticks[0].epoch
        assert step in HOST_TICK_STEPS
        for tick in ticks:
            assert tick.epoch % step == 0
            assert 0 < tick.left < 100 * KEEP_LABELS_BEFORE
            assert tick.left == pytest.approx(100 * (tick.epoch - start) / width)


def test_an_axis_years_long_keeps_at_most_max_labels() -> None:
    ticks = time_ticks(0.0, 10 * 365 * 86400.0)
    assert 1 <= len(ticks) <= MAX_TICKS
    assert all(t.daily for t in ticks)
