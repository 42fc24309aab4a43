"""Ground truth for divergence evaluation: spikes and NaNs injected into copies of real curves,
plus a detector-independent mask of the natural spikes those curves already contain.

Deterministic: each run's generator is seeded by (seed, crc32 of its file name), so results do
not depend on the order or subset of runs evaluated.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

SPIKE_FACTOR_RANGE = (1.2, 5.0)  # multiplicative spike size, drawn log-uniform (small ones common)
SPIKE_MAX_DURATION_STEPS = 50  # spike lasts 1..50 optimizer steps (uniform integer)
SPIKE_SPACING_POINTS = 300  # injections this far apart, so the detector's baseline has recovered
SPIKE_MAX_PER_RUN = 12  # enough events per run without crowding it
SPIKE_WARMUP_FRACTION = 0.05  # no injection in the first 5% of points (baseline still forming)
NATURAL_WINDOW = 25  # centred median used to find the natural spikes of the clean curve
NATURAL_RATIO = 1.1  # a point 10% above its centred median is a natural spike (as EVENTS hints)
NATURAL_MARGIN = 5  # points around a natural spike or event hint that are not "healthy"
NATURAL_EVENT_TYPES = ("spike", "explosion", "loss")  # EVENTS.csv types that mark real anomalies


@dataclass(frozen=True)
class Injection:
    kind: str  # "spike" | "nan"
    start: int  # first affected point index
    end: int  # last affected point index (inclusive)
    start_step: float
    factor: float  # spike multiplier; 0 for NaN


def run_rng(seed: int, file: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(file.encode())])


def natural_mask(steps: np.ndarray, values: np.ndarray, event_steps: list[float]) -> np.ndarray:
    """Points of the clean curve that are natural anomalies (or next to one): neither TP nor FP.

    Independent of every detector scored: a point >= NATURAL_RATIO times its centred rolling
    median (the same 10% rule as the data set's own spike hints), plus documented or hinted
    event steps, each widened by NATURAL_MARGIN points."""
    v = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(np.where(v > 0, v, np.nan))
    med = pd.Series(y).rolling(NATURAL_WINDOW, center=True, min_periods=1).median().to_numpy()
    core = np.nan_to_num(y - med, nan=0.0) >= math.log(NATURAL_RATIO)
    core |= ~np.isfinite(v)
    for step in event_steps:
        idx = int(np.searchsorted(steps, step))
        core[max(0, idx - 1) : idx + 2] = True
    return _dilate(core, NATURAL_MARGIN)


def _dilate(mask: np.ndarray, margin: int) -> np.ndarray:
    if not mask.any():
        return mask.copy()
    kernel = np.ones(2 * margin + 1)
    return np.convolve(mask.astype(float), kernel, mode="same") > 0


def inject_spikes(
    steps: np.ndarray, values: np.ndarray, avoid: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, list[Injection]]:
    """Copy of values with spikes multiplied in, away from `avoid` (natural anomalies)."""
    n = len(values)
    out = values.copy()
    lo = max(int(n * SPIKE_WARMUP_FRACTION), 60)
    spacing = SPIKE_SPACING_POINTS
    slots = np.arange(lo, n - 60, spacing)
    rng.shuffle(slots)
    injections: list[Injection] = []
    for slot in slots[:SPIKE_MAX_PER_RUN]:
        start = min(int(slot + rng.integers(0, spacing // 3)), n - 1)
        duration = int(rng.integers(1, SPIKE_MAX_DURATION_STEPS + 1))
        end = int(np.searchsorted(steps, steps[start] + duration, side="left")) - 1
        end = max(start, min(end, n - 1))
        if avoid[max(0, start - 60) : end + 60].any():
            continue  # too close to a natural spike: its effect could not be told apart
        factor = float(math.exp(rng.uniform(*np.log(SPIKE_FACTOR_RANGE))))
        out[start : end + 1] = out[start : end + 1] * factor
        injections.append(Injection("spike", start, end, float(steps[start]), factor))
    injections.sort(key=lambda i: i.start)
    return out, injections


def inject_nan(
    steps: np.ndarray, values: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, Injection]:
    """Copy with NaN/Inf from a random point: alternately a single bad value or all the rest."""
    n = len(values)
    start = int(rng.integers(max(1, n // 10), n)) if n > 2 else n - 1
    bad = float(rng.choice([np.nan, np.inf]))
    out = values.copy()
    if rng.random() < 0.5:
        out[start] = bad
        end = start
    else:
        out[start:] = bad
        end = n - 1
    return out, Injection("nan", start, end, float(steps[start]), 0.0)
