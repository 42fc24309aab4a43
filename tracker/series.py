"""Packing points into chunk arrays and reading a series back. Pure numpy, no ORM.

A resume from an earlier checkpoint makes steps go back. Every point keeps its segment, and
`latest_wins` resolves the plotted series: a later segment replaces the earlier points at and
beyond its first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STEP_DTYPE = np.dtype("<i8")
FLOAT_DTYPE = np.dtype("<f8")


@dataclass(frozen=True)
class Series:
    steps: np.ndarray  # int64
    values: np.ndarray  # float64, NaN/Inf kept
    times: np.ndarray  # float64 epoch seconds
    segments: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.steps.size)

    @classmethod
    def empty(cls) -> Series:
        return cls(
            np.empty(0, STEP_DTYPE),
            np.empty(0, FLOAT_DTYPE),
            np.empty(0, FLOAT_DTYPE),
            np.empty(0, STEP_DTYPE),
        )


def pack_steps(steps: np.ndarray) -> bytes:
    return np.ascontiguousarray(steps, dtype=STEP_DTYPE).tobytes()


def pack_floats(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype=FLOAT_DTYPE).tobytes()


TIMING_DTYPE = np.dtype("<f4")


def pack_timings(seconds: np.ndarray) -> bytes:
    return np.ascontiguousarray(seconds, dtype=TIMING_DTYPE).tobytes()


def unpack_timings(blob: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(blob, dtype=TIMING_DTYPE)


def unpack_steps(blob: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(blob, dtype=STEP_DTYPE)


def unpack_floats(blob: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(blob, dtype=FLOAT_DTYPE)


def chunk_columns(steps: np.ndarray, values: np.ndarray, times: np.ndarray) -> dict[str, object]:
    """A `MetricChunk`'s columns for these points in this order: the packed arrays and the
    summaries readers select chunks by (step range, finite value range, NaN/Inf count, rollup).
    The one definition, for the chunks ingest writes and those compaction merges."""
    finite = values[np.isfinite(values)]
    return {
        "n": int(steps.size),
        "first_step": int(steps[0]),
        "last_step": int(steps[-1]),
        "min_step": int(steps.min()),
        "max_step": int(steps.max()),
        "min_value": float(finite.min()) if finite.size else None,
        "max_value": float(finite.max()) if finite.size else None,
        "nonfinite": int(values.size - finite.size),
        "steps": pack_steps(steps),
        "values": pack_floats(values),
        "times": pack_floats(times),
        "rollup": rollup(steps, values),
    }


def concat(parts: list[tuple[int, bytes, bytes, bytes]]) -> Series:
    """Join chunk arrays (segment, steps, values, times) in storage order."""
    if not parts:
        return Series.empty()
    steps = [unpack_steps(p[1]) for p in parts]
    return Series(
        steps=np.concatenate(steps),
        values=np.concatenate([unpack_floats(p[2]) for p in parts]),
        times=np.concatenate([unpack_floats(p[3]) for p in parts]),
        segments=np.concatenate(
            [np.full(s.size, p[0], dtype=STEP_DTYPE) for p, s in zip(parts, steps, strict=True)]
        ),
    )


def superseded_mask(segs: np.ndarray, steps: np.ndarray, firsts: dict[int, int]) -> np.ndarray:
    """True where a point survives: no later segment started at or before its step."""
    keep = np.ones(segs.size, dtype=bool)
    for seg, first in firsts.items():
        keep &= ~((segs < seg) & (steps >= first))
    return keep


def latest_wins(series: Series, segment_firsts: dict[int, int] | None = None) -> Series:
    """The series as plotted: drop points that a later segment re-logged from an earlier step.

    Within one segment, points are ordered by step (stable, so a step logged twice keeps the
    later value last).
    """
    if len(series) == 0:
        return series
    segs = series.segments
    firsts = segment_firsts or {
        int(seg): int(series.steps[segs == seg].min()) for seg in np.unique(segs)
    }
    keep = superseded_mask(segs, series.steps, firsts)
    order = np.lexsort((series.steps[keep], segs[keep]))
    idx = np.flatnonzero(keep)[order]
    return Series(series.steps[idx], series.values[idx], series.times[idx], segs[idx])


# --- Rollups: per block of ROLLUP_BLOCK points, (first step, last step, min, max, mean) ---------
# A chart of 1M points at 1,000 px needs ~1,000 points per pixel: reading 64x fewer numbers
# from block rollups draws the same min/max envelope (every spike survives) far faster.
ROLLUP_BLOCK = 64
ROLLUP_FIELDS = 5


def rollup(steps: np.ndarray, values: np.ndarray) -> bytes:
    """Summarise consecutive blocks of points; NaN/Inf are left out of min/max/mean."""
    n = steps.size
    starts = np.arange(0, n, ROLLUP_BLOCK)
    ends = np.minimum(starts + ROLLUP_BLOCK, n) - 1
    finite = np.isfinite(values)
    vals = np.where(finite, values, 0.0)
    sums = np.add.reduceat(vals, starts)
    counts = np.add.reduceat(finite.astype(np.int64), starts)
    lo = np.minimum.reduceat(np.where(finite, values, np.inf), starts)
    hi = np.maximum.reduceat(np.where(finite, values, -np.inf), starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    lo = np.where(counts > 0, lo, np.nan)
    hi = np.where(counts > 0, hi, np.nan)
    out = np.column_stack([steps[starts].astype(float), steps[ends].astype(float), lo, hi, mean])
    return pack_floats(out.ravel())


@dataclass(frozen=True)
class Rollup:
    first: np.ndarray
    last: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    mean: np.ndarray
    segments: np.ndarray

    def __len__(self) -> int:
        return int(self.first.size)


def rollup_concat(parts: list[tuple[int, bytes]]) -> Rollup:
    arrays = [unpack_floats(b).reshape(-1, ROLLUP_FIELDS) for _, b in parts]
    table = np.concatenate(arrays) if arrays else np.empty((0, ROLLUP_FIELDS))
    segs = (
        np.concatenate(
            [
                np.full(a.shape[0], seg, dtype=STEP_DTYPE)
                for (seg, _), a in zip(parts, arrays, strict=True)
            ]
        )
        if arrays
        else np.empty(0, STEP_DTYPE)
    )
    return Rollup(table[:, 0], table[:, 1], table[:, 2], table[:, 3], table[:, 4], segs)


def rollup_latest_wins(r: Rollup, segment_firsts: dict[int, int]) -> Rollup:
    """Block-level latest-segment-wins: a block of an earlier segment whose first step a later
    segment re-logged is dropped (a block straddling the rewind point is kept: at coarse zoom
    that is at most 64 points at one pixel)."""
    if len(r) == 0:
        return r
    keep = superseded_mask(r.segments, r.first, segment_firsts)
    order = np.lexsort((r.first[keep], r.segments[keep]))
    idx = np.flatnonzero(keep)[order]
    return Rollup(r.first[idx], r.last[idx], r.lo[idx], r.hi[idx], r.mean[idx], r.segments[idx])


# --- Downsampling for charts: min/max per bucket (M4-style), so no spike is ever hidden ---------
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


def rollup_buckets(
    r: Rollup, *, x0: float, x1: float, buckets: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The same envelope as `minmax_buckets`, from block rollups (a block goes to the bucket of
    its first step)."""
    edges = np.linspace(x0, x1, buckets + 1)
    ok = np.isfinite(r.mean)
    x = r.first[ok]
    idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, buckets - 1)
    counts = np.bincount(idx, minlength=buckets)
    sums = np.bincount(idx, weights=r.mean[ok], minlength=buckets)
    lo = np.full(buckets, np.inf)
    hi = np.full(buckets, -np.inf)
    np.minimum.at(lo, idx, r.lo[ok])
    np.maximum.at(hi, idx, r.hi[ok])
    keep = counts > 0
    mid = (edges[:-1] + edges[1:]) / 2
    return mid[keep], sums[keep] / counts[keep], lo[keep], hi[keep]
