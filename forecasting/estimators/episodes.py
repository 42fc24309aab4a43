"""A loss divergence as an episode, judged against the run as it was before the onset.

The detectors (divergence.py) find a spike, a rise or a regression with trailing baselines: a
loss that blew up and settled nine times higher becomes, fifty points later, the baseline itself,
and the detectors fall silent while the run is still diverged. An episode keeps the reference of
its onset (the level and noise of the points before it) and says, for the whole life of the
finding, whether the loss is still above that reference (spiking, then diverged), back inside it
but not for long (recovering), or back for a sustained stretch (recovered).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forecasting.estimators import thresholds as th
from forecasting.estimators.divergence import last_at_or_above, level_curve, to_log
from forecasting.estimators.jsonable import as_json
from forecasting.estimators.smoothing import block_median, keep_latest


@dataclass(frozen=True)
class Reference:
    """The run before the onset: its log-loss level and the noise of one point about it."""

    onset_step: float
    level: float
    noise: float
    value: float  # the level as a loss, for messages
    points: int

    def to_dict(self) -> dict[str, object]:
        return as_json(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Reference | None:
        try:
            return cls(
                onset_step=float(data["onset_step"]),  # type: ignore[arg-type]
                level=float(data["level"]),  # type: ignore[arg-type]
                noise=float(data["noise"]),  # type: ignore[arg-type]
                value=float(data["value"]),  # type: ignore[arg-type]
                points=int(data["points"]),  # type: ignore[call-overload]
            )
        except (KeyError, TypeError, ValueError):
            return None

    def band(self) -> float:
        """How far (log) the recent level may stand above the reference and still be it."""
        k = th.EPISODE_RECENT_POINTS
        # A median of k points has ~1.25 sigma / sqrt(k) of noise; two such levels differ by
        # sqrt(2) of it (the reference's own median is of more points: this is conservative).
        level_noise = 1.2533 * self.noise / math.sqrt(k) * math.sqrt(2.0)
        return max(math.log(th.DIV_SPIKE_MIN_RATIO), th.EPISODE_BAND_Z * level_noise)

    def point_band(self) -> float:
        """How far (log) one point may stand above the reference and still be its noise."""
        return max(math.log(th.DIV_SPIKE_MIN_RATIO), th.EPISODE_BAND_Z * self.noise)


@dataclass(frozen=True)
class Judgement:
    state: str  # one of episode_states.STATES
    ratio: float  # the recent level over the reference's
    level_value: float  # the recent level as a loss
    since_step: float | None  # recovering/recovered: back inside the band since this step
    points_since_onset: int
    # Whether the loss has left the run before the onset: its recent level outside the band, or
    # one point outside a point's own band (a single x3 spike, a ramp's first high points). A
    # finding whose loss did neither is no episode yet.
    left: bool = True


def _clean(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(steps, dtype=float).ravel()
    v = np.asarray(values, dtype=float).ravel()
    keep = keep_latest(s)
    s, v = s[keep], v[keep]
    finite = np.isfinite(v)
    return s[finite], to_log(v[finite]) if finite.any() else v[finite]


def reference_before(steps: np.ndarray, values: np.ndarray, onset_step: float) -> Reference | None:
    """The level and noise of the EPISODE_REFERENCE_POINTS finite points before the onset."""
    s, y = _clean(steps, values)
    before = y[s < onset_step][-th.EPISODE_REFERENCE_POINTS :]
    if before.size < th.DIV_MIN_POINTS:
        return None
    level = float(np.median(before))
    d = np.diff(before)
    # Robust sd of one point from its differences (a loss's downward trend barely moves them).
    noise = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2.0)
    noise = max(noise, th.DIV_SCALE_FLOOR)
    return Reference(onset_step, level, noise, float(math.exp(level)), int(before.size))


def onset_search(
    steps: np.ndarray, values: np.ndarray, onset_step: float, not_before: float | None = None
) -> float:
    """The earliest step at or before the detectors' onset where the log-loss plausibly changed.

    The points from EPISODE_ONSET_SEARCH_POINTS before the onset to now are split in two: before
    the split a log-log line (a falling loss is not a change) with its own spread, after it a
    level and a spread of its own (a blow-up or a slow rise changes the level, a growing
    oscillation the spread). The answer is the earliest split whose likelihood is within the 95%
    bound of the best split's: a rollback from before it is safe for every onset the points allow.
    Never before `not_before` (where an earlier episode was back: its blow-up is not this one's).
    """
    s, y = _clean(steps, values)
    d0 = int(np.searchsorted(s, onset_step))
    lo = max(0, d0 - th.EPISODE_ONSET_SEARCH_POINTS)
    if not_before is not None:
        lo = max(lo, int(np.searchsorted(s, not_before)))
    m = th.DIV_MIN_POINTS
    k = d0 - lo
    if k < 2 * m or d0 >= s.size:
        return float(onset_step)
    x, r = np.log(np.maximum(s[lo:], 1.0)), y[lo:]
    x = x - x[:k].mean()  # centred: the running sums below then lose no precision
    n = r.size
    c = np.arange(m, k + 1)  # the first point of the changed part; never after the onset
    # Before the split: a line in log-step (the loss falls) and its residual spread, from
    # running sums; after it: a level and a spread of its own.
    cx, cy, cxx, cxy, cyy = (np.cumsum(a) for a in (x, r, x * x, x * r, r * r))
    i, pre_n = c - 1, c.astype(float)
    sxx = cxx[i] - cx[i] ** 2 / pre_n
    sxy = cxy[i] - cx[i] * cy[i] / pre_n
    syy = cyy[i] - cy[i] ** 2 / pre_n
    pre_var = (syy - np.where(sxx > 0, sxy**2 / np.maximum(sxx, 1e-300), 0.0)) / pre_n
    post_n = (n - c).astype(float)
    post_var = (cyy[-1] - cyy[i]) / post_n - ((cy[-1] - cy[i]) / post_n) ** 2
    floor = th.DIV_SCALE_FLOOR**2
    cost = pre_n * np.log(np.maximum(pre_var, floor)) + post_n * np.log(np.maximum(post_var, floor))
    earliest = int(c[np.argmax(cost - cost.min() <= th.EPISODE_ONSET_LR_BOUND)])
    return float(min(onset_step, s[lo + earliest]))


def judge(steps: np.ndarray, values: np.ndarray, ref: Reference) -> Judgement | None:
    """Where the loss stands against the reference, from the points at and after the onset."""
    s, y = _clean(steps, values)
    after = s >= ref.onset_step
    s, y = s[after], y[after]
    if s.size == 0:
        return None
    k = th.EPISODE_RECENT_POINTS
    recent = pd.Series(y).rolling(k, min_periods=1).median().to_numpy()
    inside = recent - ref.level < ref.band()
    level = float(recent[-1])
    ratio = float(math.exp(level - ref.level))
    # Back inside since the point after the last one outside (or since the onset).
    outside = np.flatnonzero(~inside)
    first_in = int(outside[-1]) + 1 if outside.size else 0
    if not inside[-1] or _swinging(y[first_in:], ref):
        state = "diverged" if s.size >= th.EPISODE_DIVERGED_POINTS else "spiking"
        return Judgement(state, ratio, float(math.exp(level)), None, int(s.size))
    held = s.size - first_in
    state = "recovered" if held >= th.EPISODE_RECOVER_POINTS else "recovering"
    since = float(s[first_in])
    # The median alone misses what the spike detector pages on purpose: one point at x3-6 moves
    # a median of five not at all (asking it alone lost 30% of injected spikes).
    left = outside.size > 0 or bool(np.any(y - ref.level > ref.point_band()))
    return Judgement(state, ratio, float(math.exp(level)), since, int(s.size), left)


def calm_before(steps: np.ndarray, values: np.ndarray, step: float, ref: Reference) -> bool:
    """Whether the loss was settled (at whatever level) in the points just before `step`: a
    blow-up from a settled loss is a new one; a spike alarm amid swings is the oscillation the
    episode already is."""
    s, y = _clean(steps, values)
    # Over the reference's window, not the recovery's: twenty points of a slow oscillation's
    # rising side are a line, and each of its peaks read as a new blow-up (23 messages on one
    # Nemotron replay).
    before = y[s < step][-th.EPISODE_REFERENCE_POINTS :]
    return before.size >= th.EPISODE_RECENT_POINTS and not _swinging(
        before, ref, th.EPISODE_REFERENCE_POINTS
    )


def _swinging(back: np.ndarray, ref: Reference, window: int = th.EPISODE_RECOVER_POINTS) -> bool:
    """Whether the last `window` points scatter wider than the reference's noise allows: an
    oscillation swings about the old level, its median back and its swings not."""
    tail = back[-window:]
    if tail.size < th.EPISODE_RECENT_POINTS:
        return False
    # About its own line: a loss still falling fast (a warm-down, the steep start of a run)
    # spreads twenty points as widely as a swing, and held a spike that was long back open to
    # the run's end on 37 of 49 replays.
    x = np.arange(tail.size, dtype=float)
    slope, intercept = np.polyfit(x, tail, 1)
    q75, q25 = np.percentile(tail - (intercept + slope * x), [75, 25])
    spread = float(q75 - q25) / 1.349  # a normal's sd from its interquartile range
    return spread > max(th.EPISODE_BAND_Z * ref.noise, math.log(th.DIV_SPIKE_MIN_RATIO))


@dataclass(frozen=True)
class BackAt:
    """Where the run's loss last stood at an episode's current level before its onset: the
    training from there to the run's last point is undone ("back at its level of ...")."""

    step: float
    time: float | None  # None: the series has no times
    end_step: float  # the run's last point
    end_time: float | None
    beyond: bool  # above every level before the onset: `step` is the run's first point

    @property
    def undone_steps(self) -> float:
        return max(0.0, self.end_step - self.step)

    @property
    def undone_s(self) -> float | None:
        if self.time is None or self.end_time is None:
            return None
        return max(0.0, self.end_time - self.time)


def back_at(
    steps: np.ndarray,
    values: np.ndarray,
    times: np.ndarray | None,
    *,
    level: float,
    onset_step: float,
) -> BackAt | None:
    """The last step before the onset at which the run's smoothed loss stood at `level` (log,
    the judgement's recent level) or higher; the run's first step, `beyond`, when it never stood
    that high (all its training is undone). None when that step lies among the reference's
    points just before the onset (the run as the episode compares it): the loss stands no
    higher than the noise of the run just before it, so nothing is undone beyond the episode's
    own training (which the flag already counts from the onset).

    Smoothed as the regression detector smooths (divergence.level_curve: block medians, then a
    centred median of five): on the raw points one noisy batch before the onset, or one lucky
    low one, would name the step; a trailing median lags a falling loss by half its window and
    names a step too late. Only the points before the onset are smoothed, so the blow-up's
    first points cannot lift the level of the steps just before it."""
    s, y = _clean(steps, values)
    before = s < onset_step
    if not before.any() or not math.isfinite(level):
        return None
    bs, by = block_median(s[before], y[before], th.DIV_TREND_BINS)
    levels = level_curve(by)
    found = last_at_or_above(levels, level)
    reference_from = s[before][-th.EPISODE_REFERENCE_POINTS :][0]
    if found is not None and (found == levels.size - 1 or bs[found] >= reference_from):
        return None
    step = float(s[0]) if found is None else float(bs[found])
    end_step, clock_s, clock_t = _clock(steps, times)
    if clock_s.size == 0:
        return BackAt(step, None, end_step, None, found is None)
    then = float(np.interp(step, clock_s, clock_t))
    return BackAt(step, then, end_step, float(clock_t[-1]), found is None)


def _clock(steps: np.ndarray, times: np.ndarray | None) -> tuple[float, np.ndarray, np.ndarray]:
    """The run's last step (whatever its value) and the (step, time) pairs that have a time,
    restarts resolved."""
    s = np.asarray(steps, dtype=float).ravel()
    keep = keep_latest(s)
    end = float(s[keep][-1]) if keep.any() else float("nan")
    if times is None:
        return end, np.empty(0), np.empty(0)
    t = np.asarray(times, dtype=float).ravel()
    if t.size != s.size:
        return end, np.empty(0), np.empty(0)
    ok = keep & np.isfinite(t)
    return end, s[ok], t[ok]
