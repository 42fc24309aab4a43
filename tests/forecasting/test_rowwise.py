"""The detector's fast reductions equal numpy's to the bit (forecasting/estimators/rowwise.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from forecasting.estimators.rowwise import (
    accumulate_down,
    flat_nanmedian,
    median,
    nanmedian,
    running_sums,
)


@pytest.mark.parametrize("shape", [(7, 300), (8, 300), (301, 5), (300, 1024), (1, 1)])
def test_the_fast_median_is_numpys_to_the_bit(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[0])
    # Repeated values and signed zeros: ties must not change which value is the middle.
    a = np.round(rng.standard_normal(shape), 1) * rng.choice([1.0, -1.0], shape)
    for axis in (0, 1, None):
        assert np.array_equal(median(a, axis), np.median(a, axis=axis))
    a[a > 1.5] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanmedian(a)
    assert np.array_equal(flat_nanmedian(a), want, equal_nan=True)
    for axis in (0, 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanmedian(a, axis=axis)
        assert np.array_equal(nanmedian(a, axis), want, equal_nan=True)


@pytest.mark.parametrize("columns", [3, 1024])
def test_rowwise_accumulation_is_numpys_to_the_bit(columns: int) -> None:
    a = np.random.default_rng(columns).standard_normal((200, columns)) * 1e3
    for ufunc in (np.add, np.minimum, np.maximum):
        assert np.array_equal(accumulate_down(ufunc, a), ufunc.accumulate(a, axis=0))
    seen = a > 0
    want = np.concatenate((np.zeros((1, columns)), np.cumsum(seen, axis=0, dtype=float)))
    assert np.array_equal(running_sums(seen, dtype=float), want)
