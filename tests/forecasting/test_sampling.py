"""The forecast input's sample (forecasting.sampling): grown batch by batch it is the sample of
the whole history built at once, and up to its limit it is the history itself."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from forecasting.sampling import (
    Sample,
    progress_input,
    resolved_input,
    sample_extend,
    stride_for,
)
from tracker.series import Series, latest_wins


def history(seed: int, n: int, *, resume_at: tuple[int, ...] = ()) -> Series:
    """n points in storage order: segment 1 from step 0, each resume a new segment that starts
    again from an earlier step; a few NaN and Inf."""
    rng = np.random.default_rng(seed)
    steps, segs = [], []
    step, seg = 0, 1
    cuts = sorted(resume_at)
    for i in range(n):
        if cuts and i == cuts[0]:
            cuts.pop(0)
            seg += 1
            step = max(0, step - int(rng.integers(1, 50)))
        steps.append(step)
        segs.append(seg)
        step += 1
    values = 2.0 + rng.normal(0, 0.1, n)
    values[rng.choice(n, size=max(1, n // 500), replace=False)] = np.nan
    values[rng.choice(n, size=2, replace=False)] = np.inf
    times = 1.7e9 + np.arange(n, dtype=float)
    return Series(np.array(steps, np.int64), values, times, np.array(segs, np.int64))


def part(s: Series, lo: int, hi: int) -> Series:
    return Series(s.steps[lo:hi], s.values[lo:hi], s.times[lo:hi], s.segments[lo:hi])


def same(a: Series, b: Series) -> None:
    np.testing.assert_array_equal(a.steps, b.steps)
    np.testing.assert_array_equal(a.values, b.values)  # NaN compare equal here
    np.testing.assert_array_equal(a.times, b.times)
    np.testing.assert_array_equal(a.segments, b.segments)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("nonfinite", [True, False])
def test_it_grows_batch_by_batch_into_the_sample_built_at_once(seed: int, nonfinite: bool) -> None:
    full = history(seed, 5_000, resume_at=(1_200, 3_900))
    rng = np.random.default_rng(seed)
    cuts = np.unique(np.concatenate(([0, len(full)], rng.integers(0, len(full), 60))))
    grown = Sample.empty()
    for lo, hi in itertools.pairwise(cuts):
        grown = sample_extend(grown, part(full, lo, hi), limit=300, keep_nonfinite=nonfinite)
    once = sample_extend(Sample.empty(), full, limit=300, keep_nonfinite=nonfinite)
    assert grown.stride == once.stride == stride_for(5_000, 300) == 32
    np.testing.assert_array_equal(grown.positions, once.positions)
    same(grown.kept, once.kept)
    assert grown.firsts == once.firsts
    same(progress_input(grown), progress_input(once))
    same(resolved_input(grown), resolved_input(once))


def test_up_to_its_limit_the_sample_is_the_history_itself() -> None:
    full = history(3, 2_000, resume_at=(700,))
    sample = sample_extend(Sample.empty(), full, limit=2_000, keep_nonfinite=True)
    assert sample.stride == 1
    same(progress_input(sample), full)
    same(resolved_input(sample), latest_wins(full))


def test_the_resolved_sample_is_the_resolved_history_at_the_kept_positions() -> None:
    full = history(4, 6_000, resume_at=(2_000, 2_500, 5_000))
    sample = sample_extend(Sample.empty(), full, limit=500, keep_nonfinite=True)
    # Resolve the whole history, then keep the points whose position the sample kept, and the
    # last one: latest-segment-wins must use each segment's first step over every point.
    positions = np.arange(len(full))
    tagged = Series(full.steps, positions.astype(float), full.times, full.segments)
    resolved = latest_wins(tagged)
    wanted = set(sample.positions.tolist()) | {len(full) - 1}
    pick = np.array([int(p) in wanted for p in resolved.values])
    expect = resolved.values[pick].astype(np.int64)
    got = resolved_input(sample)
    np.testing.assert_array_equal(got.times, full.times[expect])
    np.testing.assert_array_equal(got.values, full.values[expect])


def test_every_nan_is_kept_at_any_stride_and_the_last_point_is_always_there() -> None:
    full = history(5, 10_001)
    sample = sample_extend(Sample.empty(), full, limit=100, keep_nonfinite=True)
    bad = np.flatnonzero(~np.isfinite(full.values))
    assert set(bad.tolist()) <= set(sample.positions.tolist())
    progress = progress_input(sample)
    assert progress.steps[-1] == full.steps[-1] and progress.times[-1] == full.times[-1]
    # The progress input is evenly spaced: the NaN kept for the loss are not extra reports.
    at = (progress.times[:-1] - 1.7e9).astype(np.int64)  # a point's time is its position here
    np.testing.assert_array_equal(at, np.arange(0, len(full), sample.stride))
    assert len(progress) <= 100 + 1
