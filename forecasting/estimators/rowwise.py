"""Exact, faster equivalents of the numpy reductions the straggler detector runs over wide
(steps x ranks) matrices: the same values to the bit, in a fraction of numpy's time at 1,024
columns (tests/forecasting/test_rowwise.py compares them with numpy's).

Pure numpy, no Django.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Accumulating along the first axis of a C-ordered matrix, numpy walks each column down,
# striding through memory: at 1,024 columns that is ~8x slower than adding whole rows. Row by
# row performs the same additions in the same order, so the result is the same to the bit;
# under ~256 columns numpy's own loop is as fast (and a Python loop over rows is not).
ROWWISE_MIN_COLUMNS = 256


def median(a: np.ndarray, axis: int | None = None) -> Any:
    """np.median of a NaN-free 1-D or 2-D float array (over axis, or all of it), to the bit.

    np.median partitions at both middles at once, which numpy does ~4x slower than one
    partition: this partitions at the upper middle only and takes the lower middle as the
    largest value below it (the same order statistic), then (lower + upper) / 2 as np.median's
    mean of the two does. Columns are partitioned as contiguous rows of the transpose.
    """
    a = np.asarray(a, dtype=float)
    if axis is None:
        a = a.reshape(-1)
    elif a.ndim == 2 and axis == 0:
        a = np.ascontiguousarray(a.T)
    elif not (a.ndim == 2 and axis == 1) and a.ndim != 1:
        return np.median(a, axis=axis)
    n = a.shape[-1]
    if n == 0:
        return np.median(a, axis=-1)
    h = n // 2
    part = np.partition(a, h, axis=-1)
    upper = part[..., h]
    if n % 2:
        return upper
    return (part[..., :h].max(axis=-1) + upper) / 2.0


def flat_nanmedian(a: np.ndarray) -> float:
    """np.nanmedian(a) (all of it): the median of its non-NaN values, NaN if none."""
    a = np.asarray(a, dtype=float).reshape(-1)
    kept = a[~np.isnan(a)]
    return float(median(kept)) if kept.size else float("nan")


def nanmedian(a: np.ndarray, axis: int) -> np.ndarray:
    """np.nanmedian along one axis of a 2-D array, without its slow masked-array path: sort
    (NaN last) and take the middle of the finite values."""
    a = np.asarray(a, dtype=float)
    missing = np.isnan(a)
    if not missing.any():
        return median(a, axis=axis)
    if a.ndim == 2 and axis == 0 and a.shape[1] >= ROWWISE_MIN_COLUMNS:
        # Each column sorted as a contiguous row of the transpose: the same values, faster.
        return nanmedian(np.ascontiguousarray(a.T), axis=1)
    srt = np.sort(a, axis=axis)
    count = np.sum(~missing, axis=axis, keepdims=True)
    lo = np.take_along_axis(srt, np.clip((count - 1) // 2, 0, None), axis=axis)
    hi = np.take_along_axis(srt, np.clip(count // 2, 0, None), axis=axis)
    out = np.where(count > 0, (lo + hi) / 2.0, np.nan)
    return np.squeeze(out, axis=axis)


def accumulate_down(
    ufunc: np.ufunc, a: np.ndarray, *, dtype: Any = None, out: np.ndarray | None = None
) -> np.ndarray:
    """`ufunc.accumulate(a, axis=0, dtype=dtype)` (into `out` if given), row by row when wide."""
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[1] < ROWWISE_MIN_COLUMNS or a.shape[0] < 2:
        return ufunc.accumulate(a, axis=0, dtype=dtype, out=out)
    if out is None:
        out = np.empty(a.shape, dtype=dtype if dtype is not None else a.dtype)
    out[0] = a[0]
    for i in range(1, a.shape[0]):
        ufunc(out[i - 1], a[i], out=out[i])
    return out


def running_sums(a: np.ndarray, *, dtype: Any = None) -> np.ndarray:
    """`concatenate((zeros((1, m)), cumsum(a, axis=0, dtype=dtype)))`: sums of the first i rows."""
    out = np.empty((a.shape[0] + 1, a.shape[1]), dtype=dtype if dtype is not None else a.dtype)
    out[0] = 0.0
    if a.shape[0]:
        accumulate_down(np.add, a, dtype=dtype, out=out[1:])
    return out
