"""A forecast's input as a sample that grows with new points only. Pure numpy, no ORM.

The estimators read a series thinned to at most `limit` points. Thinning evenly over the whole
history (`np.linspace` over every point) moves every kept point each time one arrives, so each
forecast had to reload and unpack the run's whole history (953 ms of CPU at a million points).
Here the kept points are those whose position in storage order (segment, min_step, chunk id;
the order `tracker.selectors.series_load` reads) is a multiple of a power-of-two stride, the
smallest that keeps at most `limit` of them. A point's position never changes as points are
appended, so the sample of the first n points extends with the new points alone; when the
stride doubles, every other kept point is dropped, which is again exactly the sample of all the
points at the new stride. The sample of a history is therefore one thing, whether it was built
at once or grown batch by batch (tests/forecasting/test_sampling.py checks both ways).

Up to `limit` points the stride is 1 and the sample is the series itself, as before. Above it,
between limit/2 and limit points are kept instead of exactly `limit`, still evenly spaced.

* `keep_nonfinite`: every NaN/Inf is kept too, at any stride (a NaN is the whole signal of a
  blow-up; the previous thinning kept them the same way).
* The last point is always part of the input (the ETA reads the current step and time from it;
  the loss forecast its last step), as the even thinning's last index was.
* Latest-segment-wins needs each segment's first step over every point, not over the sample:
  kept in `firsts`, updated with the new points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracker.series import STEP_DTYPE, Series, latest_wins


@dataclass(frozen=True)
class Sample:
    stride: int  # a power of two
    points: int  # points of the history this summarises (its positions are 0..points-1)
    positions: np.ndarray  # int64, position of each kept point in storage order, increasing
    kept: Series  # the kept points, in storage order
    firsts: dict[int, int]  # segment -> its smallest step over all `points` points
    last: Series  # the history's last point in storage order (empty when there is none)

    @classmethod
    def empty(cls) -> Sample:
        return cls(1, 0, np.empty(0, STEP_DTYPE), Series.empty(), {}, Series.empty())


def stride_for(points: int, limit: int) -> int:
    """The smallest power of two that keeps at most `limit` of `points` positions."""
    stride = 1
    while -(-points // stride) > limit:
        stride *= 2
    return stride


def _keep(positions: np.ndarray, values: np.ndarray, stride: int, nonfinite: bool) -> np.ndarray:
    keep = positions % stride == 0
    if nonfinite:
        keep |= ~np.isfinite(values)
    return keep


def _take(series: Series, mask: np.ndarray) -> Series:
    return Series(
        series.steps[mask], series.values[mask], series.times[mask], series.segments[mask]
    )


def _join(a: Series, b: Series) -> Series:
    if len(a) == 0:
        return b
    if len(b) == 0:
        return a
    return Series(
        np.concatenate([a.steps, b.steps]),
        np.concatenate([a.values, b.values]),
        np.concatenate([a.times, b.times]),
        np.concatenate([a.segments, b.segments]),
    )


def sample_extend(sample: Sample, new: Series, *, limit: int, keep_nonfinite: bool) -> Sample:
    """The sample of the history `sample` summarises followed by `new` (storage order)."""
    points = sample.points + len(new)
    stride = stride_for(points, limit)
    at = np.arange(sample.points, points, dtype=STEP_DTYPE)
    fresh = _keep(at, new.values, stride, keep_nonfinite)
    if stride == sample.stride:
        # Every kept point was kept by this same rule: only the new points need choosing.
        kept = _join(sample.kept, _take(new, fresh))
        positions = np.concatenate([sample.positions, at[fresh]])
    else:
        old = _keep(sample.positions, sample.kept.values, stride, keep_nonfinite)
        kept = _join(_take(sample.kept, old), _take(new, fresh))
        positions = np.concatenate([sample.positions[old], at[fresh]])
    firsts = dict(sample.firsts)
    if len(new):
        for seg in np.unique(new.segments):
            low = int(new.steps[new.segments == seg].min())
            firsts[int(seg)] = min(low, firsts.get(int(seg), low))
    return Sample(
        stride=stride,
        points=points,
        positions=positions,
        kept=kept,
        firsts=firsts,
        last=_take(new, np.arange(len(new)) == len(new) - 1) if len(new) else sample.last,
    )


def _with_last(sample: Sample, mask: np.ndarray) -> Series:
    kept = _take(sample.kept, mask)
    positions = sample.positions[mask]
    if len(sample.last) and (positions.size == 0 or positions[-1] != sample.points - 1):
        return _join(kept, sample.last)
    return kept


def progress_input(sample: Sample) -> Series:
    """Evenly spaced points and the last one, in storage order (a rollback shows as steps going
    back): the ETA's input. NaN kept for the loss's sake are not progress reports of their own."""
    return _with_last(sample, sample.positions % sample.stride == 0)


def resolved_input(sample: Sample) -> Series:
    """The sample as plotted: latest segment wins (with every segment's first step over the
    whole history), ordered by step within a segment; NaN kept if the sample keeps them."""
    series = _with_last(sample, np.ones(sample.positions.size, dtype=bool))
    if len(series) == 0:
        return series
    return latest_wins(series, sample.firsts)
