"""The curve loader the evaluation, the demo replay and the dashboard fixtures share."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from curveset import curve_rows

DEMO = Path(__file__).resolve().parents[2] / "demo" / "data"


def test_interval_logged_step_times_cover_the_steps_between_timing_lines():
    rows, total = curve_rows(next(DEMO.glob("megatron-lm__bert_release*.csv")))
    t = np.array([r.t for r in rows])
    assert total == 20_000
    assert np.all(np.diff(t) >= 0)
    # ~0.29 s a step over 20,000 steps: the mean of each timing line covers every step since
    # the previous timing line, not just the 5 steps since the row before it.
    assert 5_000 < t[-1] < 6_500
    assert len({round(x, 6) for x in t}) > 0.9 * len(t)  # untimed rows are interpolated


def test_a_timer_reset_keeps_the_clock_monotone():
    rows, _ = curve_rows(next(DEMO.glob("modded-nanogpt__*.csv")))
    t = np.array([r.t for r in rows])
    assert np.all(np.diff(t) >= 0)
    assert rows[-1].val_loss is not None and rows[0].step == 0
