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


def unpack_steps(blob: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(blob, dtype=STEP_DTYPE)


def unpack_floats(blob: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(blob, dtype=FLOAT_DTYPE)


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


def latest_wins(series: Series) -> Series:
    """The series as plotted: drop points that a later segment re-logged from an earlier step.

    Within one segment, points are ordered by step (stable, so a step logged twice keeps the
    later value last).
    """
    if len(series) == 0:
        return series
    keep = np.ones(len(series), dtype=bool)
    segs = series.segments
    unique = np.unique(segs)
    for seg in unique[1:]:
        in_seg = segs == seg
        first = series.steps[in_seg].min()
        keep &= ~((segs < seg) & (series.steps >= first))
    order = np.lexsort((series.steps[keep], segs[keep]))
    idx = np.flatnonzero(keep)[order]
    return Series(series.steps[idx], series.values[idx], series.times[idx], segs[idx])
