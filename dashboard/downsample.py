"""Min/max-per-bucket downsampling: every spike survives at every zoom level (M4-style)."""

from __future__ import annotations

import numpy as np


def minmax_buckets(
    x: np.ndarray, y: np.ndarray, *, buckets: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split x (sorted) into equal-width buckets; return (x_mid, mean, min, max) per bucket.

    Non-finite values are ignored by min/max/mean so one NaN does not blank a bucket; callers
    mark NaN positions separately.
    """
    if x.size <= buckets:
        return x.astype(float), y, y, y
    edges = np.linspace(float(x[0]), float(x[-1]), buckets + 1)
    idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, buckets - 1)
    finite = np.isfinite(y)
    xi, yi = idx[finite], y[finite]
    counts = np.bincount(xi, minlength=buckets)
    sums = np.bincount(xi, weights=yi, minlength=buckets)
    lo = np.full(buckets, np.inf)
    hi = np.full(buckets, -np.inf)
    np.minimum.at(lo, xi, yi)
    np.maximum.at(hi, xi, yi)
    keep = counts > 0
    mid = (edges[:-1] + edges[1:]) / 2
    return mid[keep], sums[keep] / counts[keep], lo[keep], hi[keep]
