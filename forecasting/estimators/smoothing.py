"""Small numeric helpers shared by the loss and divergence estimators (numpy only)."""

from __future__ import annotations

import numpy as np


def keep_latest(steps: np.ndarray) -> np.ndarray:
    """Index mask of points that survive restarts: when the step counter goes backwards the job
    resumed from a checkpoint, so the later log supersedes every earlier point at or after it."""
    s = np.asarray(steps, dtype=float)
    ok = np.isfinite(s)
    # Suffix minimum over later steps: a point is kept only if every later point has a larger step.
    later = np.where(ok, s, np.inf)[::-1]
    suffix_min = np.minimum.accumulate(later)[::-1]
    next_min = np.append(suffix_min[1:], np.inf)
    return ok & (s < next_min)


def clean_series(
    steps: np.ndarray, values: np.ndarray, *, finite_only: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Strictly increasing steps (restarts resolved), optionally only finite values."""
    s = np.asarray(steps, dtype=float).ravel()
    v = np.asarray(values, dtype=float).ravel()
    n = min(len(s), len(v))
    s, v = s[:n], v[:n]
    keep = keep_latest(s)
    if finite_only:
        keep &= np.isfinite(v)
    return s[keep], v[keep]


def block_median(
    steps: np.ndarray, values: np.ndarray, max_points: int
) -> tuple[np.ndarray, np.ndarray]:
    """Downsample to at most max_points by medians of consecutive blocks (spike-resistant)."""
    n = len(values)
    if n <= max_points:
        return steps.copy(), values.copy()
    k = int(np.ceil(n / max_points))
    m = n // k
    head_s = steps[: m * k].reshape(m, k)
    head_v = values[: m * k].reshape(m, k)
    out_s = head_s.mean(axis=1)
    out_v = np.median(head_v, axis=1)
    if m * k < n:
        out_s = np.append(out_s, steps[m * k :].mean())
        out_v = np.append(out_v, np.median(values[m * k :]))
    return out_s, out_v


def local_level(steps: np.ndarray, values: np.ndarray, window: int) -> float:
    """Smoothed value at the last step: a line through the last `window` points plus the median
    residual, so the trend inside the window does not bias it and single spikes barely move it."""
    w = int(max(1, min(window, len(values))))
    s, v = steps[-w:], values[-w:]
    if w < 3 or np.ptp(s) <= 0:
        return float(np.median(v))
    x = s - s[-1]
    slope, icpt = np.polyfit(x, v, 1)
    resid = v - (icpt + slope * x)
    level = float(icpt + np.median(resid))
    # A line fitted to a short noisy window can tip; never leave the window's own range.
    return float(np.clip(level, np.min(v), np.max(v)))
