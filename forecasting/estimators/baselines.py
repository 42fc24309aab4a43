"""The ETAs that common progress bars show, re-implemented to score Runcast against.

Each takes the progress points seen so far (steps, times in seconds, arrival order) and the total
steps, and returns the seconds still to go from the last point, or None without a rate. They
follow what the libraries do, including their blind spots (warm-up, gaps, rollbacks):

* tqdm_ema: tqdm's default `smoothing=0.3`, an exponential moving average of the steps and of
  the seconds per update, rate = EMA(steps) / EMA(seconds).
* lightning_mean: Lightning's progress bar shows the cumulative mean rate since the start.
* rich_30s: rich's `TimeRemainingColumn` uses the speed over the last 30 s of samples.
* median_last_n: median seconds per step over the last N intervals (a robust hand-rolled ETA).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

TQDM_SMOOTHING = 0.3  # tqdm's default
RICH_WINDOW_S = 30.0  # rich.progress.Progress(speed_estimate_period=30.0) default
MEDIAN_LAST_N = 20  # enough intervals to ignore a slow step, few enough to follow a change

Baseline = Callable[[np.ndarray, np.ndarray, float], "float | None"]


def _prepare(steps: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    s = np.asarray(steps, dtype=float)
    t = np.asarray(times, dtype=float)
    ok = np.isfinite(s) & np.isfinite(t)
    s, t = s[ok], t[ok]
    return (s, t) if s.size >= 2 else None


def _remaining(steps: np.ndarray, total: float, rate: float) -> float | None:
    if not (rate > 0 and np.isfinite(rate)):
        return None
    return max(0.0, total - float(steps[-1])) / rate


def tqdm_ema(steps: np.ndarray, times: np.ndarray, total: float) -> float | None:
    prepared = _prepare(steps, times)
    if prepared is None:
        return None
    s, t = prepared
    ds, dt = np.diff(s), np.diff(t)
    a = TQDM_SMOOTHING
    # tqdm's EMA (last = a * x + (1 - a) * last, bias-corrected) is a linear filter; the bias
    # correction cancels in the ratio, leaving these weights (newest a, older ones decaying).
    weights = a * (1 - a) ** np.arange(ds.size - 1, -1, -1, dtype=float)
    ema_ds = float(np.dot(weights, ds))
    ema_dt = float(np.dot(weights, dt))
    return _remaining(s, total, ema_ds / ema_dt if ema_dt > 0 else float("nan"))


def lightning_mean(steps: np.ndarray, times: np.ndarray, total: float) -> float | None:
    prepared = _prepare(steps, times)
    if prepared is None:
        return None
    s, t = prepared
    span = float(t[-1] - t[0])
    return _remaining(s, total, (s[-1] - s[0]) / span if span > 0 else float("nan"))


def rich_30s(steps: np.ndarray, times: np.ndarray, total: float) -> float | None:
    prepared = _prepare(steps, times)
    if prepared is None:
        return None
    s, t = prepared
    start = int(np.searchsorted(t, t[-1] - RICH_WINDOW_S, side="left"))
    # rich keeps the samples of the last 30 s; with a sparse log that is fewer than two, so it
    # falls back to the last interval (rich then shows no ETA; we take the nearest it would show).
    start = min(start, s.size - 2)
    span = float(t[-1] - t[start])
    return _remaining(s, total, (s[-1] - s[start]) / span if span > 0 else float("nan"))


def median_last_n(steps: np.ndarray, times: np.ndarray, total: float) -> float | None:
    prepared = _prepare(steps, times)
    if prepared is None:
        return None
    s, t = prepared
    ds, dt = np.diff(s)[-MEDIAN_LAST_N:], np.diff(t)[-MEDIAN_LAST_N:]
    ok = ds > 0
    if not ok.any():
        return None
    spr = float(np.median(dt[ok] / ds[ok]))
    return _remaining(s, total, 1.0 / spr if spr > 0 else float("nan"))


BASELINES: dict[str, Baseline] = {
    "tqdm_ema": tqdm_ema,
    "lightning_mean": lightning_mean,
    "rich_30s": rich_30s,
    "median_last_n": median_last_n,
}
