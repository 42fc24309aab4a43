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


def test_a_young_run_is_judged_by_the_heartbeat_its_client_declared() -> None:
    # Its create at 0 and one batch with steps at 10 s (a heartbeat and progress: one contact).
    beats, steps_t = np.array([10.0]), np.array([10.0])
    young = {"opened_at": 0.0, "declared_interval_s": 15.0, "unknown_cadence_limit_s": 3600.0}
    alive = detect_stall(beats, steps_t, np.array([1.0]), now=80.0, **young)
    assert alive is not None and not alive.stalled  # 70 s: under 5 heartbeats of 15 s
    dead = detect_stall(beats, steps_t, np.array([1.0]), now=90.0, **young)
    assert dead is not None and dead.stalled and dead.kind == "no_heartbeat"
    assert dead.silent_s == pytest.approx(80.0) and dead.usual_interval_s is None
    assert dead.explanation == (
        "no heartbeat for 1 min 20 s (2 contacts since it started; its client beats every 15 s"
        " while alive)"
    )
    json.dumps(dead.to_dict(), allow_nan=False)


def test_a_young_run_without_a_declared_heartbeat_gets_the_fixed_limit() -> None:
    empty = np.array([])
    limit = {"opened_at": 0.0, "unknown_cadence_limit_s": 3600.0}
    compiling = detect_stall(empty, empty, empty, now=1200.0, **limit)
    assert compiling is not None and not compiling.stalled
    dead = detect_stall(empty, empty, empty, now=3700.0, **limit)
    assert dead is not None and dead.stalled and dead.kind == "no_heartbeat"
    assert dead.explanation == (
        "no heartbeat for 1 h (1 contact since it started, too few for a cadence; 1 h of silence"
        " is the limit)"
    )
    # Silence while the server was away is not the run's.
    back = detect_stall(empty, empty, empty, now=3700.0, listening_since=3000.0, **limit)
    assert back is not None and not back.stalled
    # Without a limit to judge it by, nothing is said (the estimator alone, as before).
    assert detect_stall(empty, empty, empty, now=3700.0, opened_at=0.0) is None


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
