"""GPU activity, clocks: how far each series' clock is from its peers'.

Each node's power meter (or agent) stamps its readings with its own clock. On one host every
GPU shares it; across nodes they need not: the eight meters of Dell's v4.1 8xXE9680 runs are
0-17 s apart, the same in every run (bench/data/power-dell/README.md), so a node's eval dip
falls beside its peers' and reads as foreign work on one and a drop on the other at every eval.
The run's nodes do the same work at the same time, so the offset is where a series best
matches its peers: the lag of the highest correlation with the peers' median, the median lag
taken as zero (the job's own log keeps its clock; levels.py's tolerance absorbs the rest).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from forecasting.estimators import thresholds as th
from forecasting.estimators.gpu_activity.levels import sampling_period


def peer_offsets(
    series: Sequence[tuple[np.ndarray, np.ndarray]],
    max_offset_s: float = th.GPU_CLOCK_MAX_OFFSET_S,
    rounds: int = 2,
) -> np.ndarray:
    """Seconds to add to each series' times so that it lines up with its peers.

    `series`: (times, values) per node. Offsets under one sampling period are left at 0: the
    peer band already holds one period of read-time jitter (episodes._peer_departure), and a
    sub-period lag found on 2-s readings is the grid's, not the clock's. Fewer than three
    series: no median to line up with, all 0.
    """
    n = len(series)
    offsets = np.zeros(n)
    if n < 3:
        return offsets
    period = float(np.median([sampling_period(np.asarray(t, float)) for t, _ in series]))
    step = period / 2
    start = max(float(np.min(t)) for t, _ in series)
    end = min(float(np.max(t)) for t, _ in series)
    if end - start < 4 * max_offset_s:
        return offsets
    grid = np.arange(start, end, step)
    lags = np.arange(-max_offset_s, max_offset_s + step / 2, step)
    for _ in range(rounds):
        stack = np.vstack(
            [
                np.interp(grid, np.asarray(t, float) + o, v)
                for (t, v), o in zip(series, offsets, strict=True)
            ]
        )
        for i, (t, v) in enumerate(series):
            # The median of the others, not of all: a series must not find itself.
            others = np.median(np.delete(stack, i, axis=0), axis=0)
            offsets[i] = _best_lag(np.asarray(t, float), np.asarray(v, float), grid, others, lags)
        offsets -= np.median(offsets)
    offsets[np.abs(offsets) < period] = 0.0
    return offsets


def _best_lag(
    t: np.ndarray, v: np.ndarray, grid: np.ndarray, reference: np.ndarray, lags: np.ndarray
) -> float:
    best, best_lag = -np.inf, 0.0
    for lag in lags:
        ref = np.interp(t + lag, grid, reference, left=np.nan, right=np.nan)
        ok = np.isfinite(ref)
        if ok.sum() < 10 or np.std(v[ok]) == 0 or np.std(ref[ok]) == 0:
            continue
        r = float(np.corrcoef(v[ok], ref[ok])[0, 1])
        # Ties (a flat series) keep the smaller lag: no evidence, no shift.
        if r > best + 1e-9 or (abs(r - best) <= 1e-9 and abs(lag) < abs(best_lag)):
            best, best_lag = r, float(lag)
    return best_lag
