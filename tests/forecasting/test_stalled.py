from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forecasting.estimators.stalled import detect_stall

CURVES = Path(os.environ.get("RUNCAST_CURVES", "/work/shared/data/curves"))


def test_too_little_history() -> None:
    assert detect_stall(np.array([0.0]), np.array([]), np.array([]), now=10.0) is None


def test_healthy_run() -> None:
    beats = np.arange(0.0, 600.0, 10.0)
    steps = np.arange(beats.size, dtype=float)
    res = detect_stall(beats, beats, steps, now=beats[-1] + 5.0)
    assert res is not None and not res.stalled
    assert res.usual_interval_s == pytest.approx(10.0)
    json.dumps(res.to_dict(), allow_nan=False)


def test_no_heartbeat() -> None:
    beats = np.arange(0.0, 600.0, 10.0)
    res = detect_stall(beats, beats, np.arange(beats.size, dtype=float), now=beats[-1] + 900.0)
    assert res is not None and res.stalled and res.kind == "no_heartbeat"
    assert res.silent_s == pytest.approx(900.0)
    assert "15 min" in res.explanation


def test_alive_but_stuck() -> None:
    beats = np.arange(0.0, 3600.0, 10.0)
    progress_t = np.arange(0.0, 1800.0, 30.0)
    steps = np.arange(progress_t.size, dtype=float)
    # Steps keep being logged after 1800 s but never advance (a hung collective, a loop on NaN).
    progress_t = np.concatenate((progress_t, np.arange(1800.0, 3600.0, 30.0)))
    steps = np.concatenate((steps, np.full(60, steps[-1])))
    res = detect_stall(beats, progress_t, steps, now=3600.0)
    assert res is not None and res.stalled and res.kind == "no_progress"
    assert res.silent_s == pytest.approx(3600.0 - 1770.0)


def test_a_stop_on_a_steady_sparse_cadence_is_a_stall() -> None:
    """A run that reports progress every 286 s like clockwork (an MLPerf log), alive, and then
    no step for 1,100 s: under five usual intervals, but nearly four times its longest one."""
    beats = np.arange(0.0, 6000.0, 15.0)  # heartbeats go on throughout
    progress_t = np.arange(0.0, 3500.0, 286.0)
    steps = np.arange(progress_t.size, dtype=float)
    res = detect_stall(beats, progress_t, steps, now=progress_t[-1] + 1100.0)
    assert res is not None and res.stalled and res.kind == "no_progress"
    # The same silence on a cadence that has shown pauses that long is its rhythm, not a stall.
    uneven = progress_t.copy()
    uneven[6:] += 400.0  # one pause of 686 s among the intervals seen
    res = detect_stall(beats, uneven, steps, now=uneven[-1] + 1100.0)
    assert res is not None and not res.stalled


def test_short_silence_under_minimum_is_healthy() -> None:
    beats = np.arange(0.0, 20.0, 1.0)
    res = detect_stall(beats, beats, np.arange(20.0), now=19.0 + 30.0)  # 30x usual, but 30 s
    assert res is not None and not res.stalled


@pytest.mark.skipif(not (CURVES / "runs").is_dir(), reason="curve set not present")
def test_real_curve_healthy_then_stalled() -> None:
    frame = pd.read_csv(
        CURVES / "runs" / "parameter-golf__track_non_record_16mb-2026-03-31_LegendreGPT-train.csv"
    )
    t = frame["elapsed_s"].to_numpy(float)
    s = frame["step"].to_numpy(float)
    ok = np.isfinite(t)
    t, s = t[ok], s[ok]
    empty = np.array([])
    healthy = detect_stall(empty, t, s, now=t[-1] + 1.0)
    assert healthy is not None and not healthy.stalled
    stuck = detect_stall(empty, t, s, now=t[-1] + 3600.0)
    assert stuck is not None and stuck.stalled
