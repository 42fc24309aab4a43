"""Loss trend forecast: where will the (smoothed) loss be at the planned end of the run?

Models, all fitted on a spike-resistant downsampled copy of the curve (block medians):
- ``power_law``: L(s) = a + b * s**-c, the usual shape of a loss curve under a constant or slowly
  varying learning rate; c by grid search, (a, b) by constrained weighted least squares.
- ``schedule_aware``: when the learning rate is logged, L = L0 + A * S1**-alpha - C * S2 with S1 the
  cumulative learning rate and S2 the annealing area (Tissue et al. 2024, "Scaling law with learning
  rate annealing"). A cosine or WSD anneal makes a late drop that a plain power law misses.
- ``last_smoothed``: the current smoothed level, the fallback when a curve cannot be fitted.
Without a logged LR the headline ``power_law`` forecast continues a log-log line (a pure power
law, no asymptote) from the smoothed level, averaged with a + b * s**-c far beyond the current
step; docs/forecasting-loss.md explains why and shows the evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.signal import lfilter

from forecasting.estimators import calibration
from forecasting.estimators import thresholds as th
from forecasting.estimators.jsonable import as_json
from forecasting.estimators.smoothing import block_median, clean_series, local_level


@dataclass
class LossForecast:
    final_step: float
    p10: float
    p50: float
    p90: float
    model: str
    smoothed_last: float
    target: float | None
    target_step: float | None
    target_reachable: bool | None
    explanation: str
    # Added keys: the forecast rests on little data (damped towards the current level), what it
    # rests on, and the calibration factor applied to its interval (calibration.py).
    early: bool = False
    basis: str = ""
    interval_scale: float = 1.0
    # How far below the fitted path the loss could still fall if it kept its recent linear rate
    # (an anneal in progress); widens the lower side only, after the calibration factor.
    anneal_drop: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return as_json(self)


@dataclass(frozen=True)
class _Fit:
    """A fitted curve: predict(step) -> loss, plus its in-sample residual scale."""

    kind: str
    params: tuple[float, ...]
    resid_sd: float
    n: int

    def predict(self, x: np.ndarray) -> np.ndarray:
        a, b, c, scale = self.params
        return a + b * np.power(np.maximum(x, 1e-9) / scale, -c)


# ----------------------------------------------------------------------------- preparation


def prepare(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finite, restart-resolved points, downsampled for fitting."""
    s, v = clean_series(steps, values)
    return block_median(s, v, th.LOSS_FIT_MAX_POINTS)


def smoothed_level(steps: np.ndarray, values: np.ndarray) -> float:
    """Smoothed loss at the last logged step.

    A log-log line through the recent curve plus the median residual of the last window: the
    line carries the shape (so the trend inside the window does not bias the level) and the
    median of many residuals is steadier than the end point of a short local line."""
    n = len(values)
    window = min(
        max(th.LOSS_LEVEL_MIN_POINTS, round(n * th.LOSS_LEVEL_WINDOW_FRACTION)),
        th.LOSS_LEVEL_MAX_POINTS,
    )
    ds, dv = block_median(steps, values, th.LOSS_FIT_MAX_POINTS)
    line = _loglog_line(ds, dv)
    if line is None or window < th.LOSS_LEVEL_MIN_POINTS:
        return local_level(steps, values, window)
    slope, icpt = line
    s_w, v_w = steps[-window:], values[-window:]
    if np.min(s_w) <= 0:
        return local_level(steps, values, window)
    fitted = np.exp(icpt + slope * np.log(s_w))
    level = float(np.exp(icpt + slope * np.log(steps[-1])) + np.median(v_w - fitted))
    return float(np.clip(level, np.min(v_w), np.max(v_w)))


def _loglog_line(s: np.ndarray, v: np.ndarray) -> tuple[float, float] | None:
    """(slope, intercept) of log(loss) on log(step) over the recent part, recency-weighted."""
    keep = (s > 0) & (v > 0) & (s >= s[-1] * th.LOSS_LOGLOG_START_FRACTION)
    if keep.sum() < 2 or np.ptp(s[keep]) <= 0:
        return None
    x, y = np.log(s[keep]), np.log(v[keep])
    w = np.sqrt(_weights(s[keep] / s[-1]))
    slope, icpt = np.polyfit(x, y, 1, w=w)
    return float(slope), float(icpt)


def _fit_window(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Points used for curve fitting: after the warm-up peak and past the first few percent of
    steps, where the loss has not settled into its power-law regime yet."""
    n = len(s)
    if n < th.LOSS_MIN_FIT_POINTS:
        return np.ones(n, dtype=bool)
    early = max(1, int(n * th.LOSS_WARMUP_SEARCH_FRACTION))
    peak = int(np.argmax(v[:early]))
    mask = np.arange(n) >= peak
    mask &= s >= s[-1] * th.LOSS_FIT_START_FRACTION
    if mask.sum() < th.LOSS_MIN_FIT_POINTS:
        mask = np.arange(n) >= n - th.LOSS_MIN_FIT_POINTS
    return mask


# ----------------------------------------------------------------------------- power law


def _solve_ab(
    basis: np.ndarray, v: np.ndarray, w: np.ndarray, floor: float, ceiling: float
) -> tuple[float, float, float]:
    """Weighted least squares for v = a + b * basis with b >= 0 and floor <= a <= ceiling."""
    sw = np.sqrt(w)
    design = np.column_stack([np.ones_like(basis), basis]) * sw[:, None]
    (a, b), *_ = np.linalg.lstsq(design, v * sw, rcond=None)
    if b < 0:  # a rising fit is not a power-law decay: flat line instead
        a, b = float(np.average(v, weights=w)), 0.0
    if a < floor or a > ceiling:
        a = float(np.clip(a, floor, ceiling))
        denom = float(np.sum(w * basis * basis))
        b = max(0.0, float(np.sum(w * basis * (v - a))) / denom) if denom > 0 else 0.0
    sse = float(np.sum(w * (v - a - b * basis) ** 2))
    return a, b, sse


def fit_power_law(
    steps: np.ndarray, values: np.ndarray, *, recency_weighted: bool = True
) -> _Fit | None:
    """L = a + b * (s / s_last)**-c on prepared (downsampled) points."""
    mask = _fit_window(steps, values)
    s, v = steps[mask], values[mask]
    s_pos = s > 0
    s, v = s[s_pos], v[s_pos]
    if len(s) < th.LOSS_MIN_FIT_POINTS or np.ptp(s) <= 0:
        return None
    scale = float(s[-1])
    x = s / scale
    w = _weights(x) if recency_weighted else np.ones_like(x)
    floor = 0.0 if np.min(v) > 0 else -np.inf  # cross-entropy cannot go below zero
    ceiling = float(np.min(v))  # the asymptote lies below every observed point
    best: tuple[float, float, float, float] | None = None
    for c in th.LOSS_POWER_EXPONENTS:
        a, b, sse = _solve_ab(np.power(x, -c), v, w, floor, ceiling)
        if best is None or sse < best[3]:
            best = (a, b, float(c), sse)
    assert best is not None
    a, b, c, sse = best
    resid_sd = math.sqrt(sse / max(1.0, float(np.sum(w)) - 3.0) * len(w) / float(np.sum(w)))
    return _Fit("power_law", (a, b, c, scale), resid_sd, len(s))


def _weights(x: np.ndarray) -> np.ndarray:
    """Later points count more: the end of the prefix says most about the next stretch."""
    return np.power(np.clip(x, 1e-6, None), th.LOSS_RECENCY_POWER)


# ----------------------------------------------------------------------------- schedule aware


def _lr_on_grid(lr_steps: np.ndarray, lr_values: np.ndarray, grid: np.ndarray) -> np.ndarray | None:
    ls, lv = clean_series(lr_steps, lr_values)
    if len(ls) < 2 or np.max(lv) <= 0:
        return None
    eta = np.interp(grid, ls, lv)
    beyond = grid > ls[-1]
    if beyond.any():
        # The future schedule is not logged: continue the recent slope (exact for a linear WSD
        # decay, close for the tail of a cosine, constant for a constant phase), never below 0.
        recent = ls >= ls[-1] - th.LOSS_LR_SLOPE_FRACTION * (ls[-1] - ls[0])
        slope = np.polyfit(ls[recent], lv[recent], 1)[0] if recent.sum() >= 2 else 0.0
        slope = min(0.0, slope)
        eta[beyond] = np.maximum(lv[-1] + slope * (grid[beyond] - ls[-1]), 0.0)
    return eta / np.max(eta)


def _schedule_areas(grid: np.ndarray, eta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """S1 (forward area) and S2 (annealing area with momentum) on a uniform step grid."""
    dt = float(grid[1] - grid[0])
    s1 = np.cumsum(eta) * dt + 1e-9
    decay = th.LOSS_ANNEAL_MOMENTUM**dt
    drop = np.append(0.0, eta[:-1] - eta[1:])
    m = lfilter([1.0], [1.0, -decay], drop * (1 - decay) / (1 - th.LOSS_ANNEAL_MOMENTUM) / dt)
    s2 = np.cumsum(m) * dt
    return s1, s2


@dataclass(frozen=True)
class _ScheduleFit:
    grid: np.ndarray
    curve: np.ndarray
    resid_sd: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.interp(x, self.grid, self.curve)


def fit_schedule_aware(
    steps: np.ndarray,
    values: np.ndarray,
    lr_steps: np.ndarray,
    lr_values: np.ndarray,
    horizon: float,
) -> _ScheduleFit | None:
    mask = _fit_window(steps, values)
    s, v = steps[mask], values[mask]
    if len(s) < th.LOSS_MIN_FIT_POINTS:
        return None
    # The lr series as logged may hold NaN or infinite steps and restarts: the grid starts at
    # its first kept step (an infinite one made every grid point NaN and the fit raise).
    lr_steps, lr_values = clean_series(lr_steps, lr_values)
    if len(lr_steps) < 2:
        return None
    lo = min(float(lr_steps[0]), float(steps[0]))
    grid = np.linspace(lo, max(horizon, float(steps[-1])), th.LOSS_SCHEDULE_GRID)
    eta = _lr_on_grid(lr_steps, lr_values, grid)
    if eta is None:
        return None
    s1, s2 = _schedule_areas(grid, eta)
    s1 = s1 / np.interp(s[-1], grid, s1)  # scale so the basis is O(1) at the cut-off
    x1, x2 = np.interp(s, grid, s1), np.interp(s, grid, s2)
    w = _weights(s / s[-1])
    floor = 0.0 if np.min(v) > 0 else -np.inf
    best: tuple[float, np.ndarray, float] | None = None
    for alpha in th.LOSS_POWER_EXPONENTS:
        coef, sse = _solve_schedule(np.power(x1, -alpha), x2, v, w, floor)
        if best is None or sse < best[2]:
            best = (float(alpha), coef, sse)
    assert best is not None
    alpha, (l0, amp, c2), sse = best
    curve = l0 + amp * np.power(s1, -alpha) - c2 * s2
    resid_sd = math.sqrt(sse / max(1.0, float(np.sum(w)) - 4.0) * len(w) / float(np.sum(w)))
    return _ScheduleFit(grid, curve, resid_sd)


def _solve_schedule(
    b1: np.ndarray, b2: np.ndarray, v: np.ndarray, w: np.ndarray, floor: float
) -> tuple[np.ndarray, float]:
    sw = np.sqrt(w)
    design = np.column_stack([np.ones_like(b1), b1, -b2])
    coef, *_ = np.linalg.lstsq(design * sw[:, None], v * sw, rcond=None)
    if coef[2] < 0 or coef[1] < 0:  # annealing can only lower the loss; decay term must decay
        keep = [0, 1] if coef[1] >= 0 else [0, 2]
        sub, *_ = np.linalg.lstsq(design[:, keep] * sw[:, None], v * sw, rcond=None)
        coef = np.zeros(3)
        coef[keep] = np.maximum(sub, [-np.inf, 0.0])
    coef[0] = max(coef[0], floor)
    sse = float(np.sum(w * (v - design @ coef) ** 2))
    return coef, sse


# ----------------------------------------------------------------------------- forecast


def forecast_loss(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    total_steps: float | None,
    lr_steps: np.ndarray | None = None,
    lr_values: np.ndarray | None = None,
    target: float | None = None,
) -> LossForecast | None:
    """Forecast the smoothed loss at the planned end (total_steps) with an 80% interval."""
    s_all, v_all = clean_series(steps, values)
    if len(s_all) < th.LOSS_MIN_POINTS:
        return None
    level = smoothed_level(s_all, v_all)
    now = float(s_all[-1])
    end = float(total_steps) if total_steps and total_steps > now else now
    s, v = block_median(s_all, v_all, th.LOSS_FIT_MAX_POINTS)
    model, path, resid_sd, gap = _choose_model(s, v, level, lr_steps, lr_values, end)
    fitted = float(path(np.array([end]))[0]) if path is not None and end > now else level
    # Early (few points, or a tiny share of the run seen) the fitted change is damped towards
    # the current level: a slope from five points, extrapolated 100x, swings with every new point
    # (one run's forecast went 1.80 -> 6.53 -> 2.29 within a minute). The interval keeps the
    # undamped change as model risk, so it stays wide.
    weight = _damping(len(s_all), now, end)
    early = weight < 1.0
    p50 = level + weight * (fitted - level)
    half = _half_width(level, fitted, gap, resid_sd, len(s_all), now, end)
    scale = calibration.scale_at(now / end if end > 0 else 1.0, calibration.LOSS_SCALE)
    half *= scale
    anneal = _anneal_drop(s, v, level, p50, end)
    p10, p90 = p50 - math.hypot(half, anneal), p50 + half
    if np.min(v_all) > 0:
        p10 = max(p10, 0.0)
    t_step, reachable = _target(target, s_all, v_all, level, path, now, end)
    explanation = _explain(model, level, p50, p10, p90, now, end, total_steps, target, t_step)
    return LossForecast(
        final_step=end,
        p10=float(p10),
        p50=float(p50),
        p90=float(p90),
        model=model,
        smoothed_last=level,
        target=target,
        target_step=t_step,
        target_reachable=reachable,
        explanation=explanation,
        early=early,
        basis=(
            f"{'early: change damped x' + format(weight, '.2f') + ', ' if early else ''}"
            f"{model} from {len(s_all)} points ({now / end:.0%} of the steps)"
        ),
        interval_scale=scale,
        anneal_drop=anneal,
    )


def _anneal_drop(s: np.ndarray, v: np.ndarray, level: float, p50: float, end: float) -> float:
    """The extra fall below the forecast if the loss kept its recent linear rate.

    A learning-rate anneal (cosine tail, WSD or warmdown decay) makes the loss fall about
    linearly in steps until the end, faster than the decelerating power law the forecast
    follows: at 90% of the parameter-golf runs the truth lay below the median in 87% of them,
    by more than the interval (issue 9). The recent rate (a line through the last
    LOSS_ANNEAL_WINDOW of the prefix) is extrapolated no further than the stretch it was
    measured on, so the steep early descent does not open the lower side to zero.
    """
    now = float(s[-1])
    recent = s >= now - th.LOSS_ANNEAL_WINDOW * (now - float(s[0]))
    if end <= now or recent.sum() < th.LOSS_MIN_POINTS or np.ptp(s[recent]) <= 0:
        return 0.0
    slope = float(np.polyfit(s[recent], v[recent], 1)[0])
    reach = min(end - now, now - float(s[recent][0]))
    return max(0.0, -slope * reach - (level - p50))


def _damping(n: int, now: float, end: float) -> float:
    """Weight of the fitted change in the forecast: 1 once there are LOSS_EARLY_MIN_POINTS
    points and LOSS_EARLY_MIN_SHARE of the run is seen, less (linearly) before."""
    by_points = min(1.0, n / th.LOSS_EARLY_MIN_POINTS)
    by_share = min(1.0, (now / end) / th.LOSS_EARLY_MIN_SHARE) if end > 0 and now > 0 else 1.0
    return by_points * by_share


def _choose_model(
    s: np.ndarray,
    v: np.ndarray,
    level: float,
    lr_steps: np.ndarray | None,
    lr_values: np.ndarray | None,
    end: float,
) -> tuple[str, Callable[[np.ndarray], np.ndarray] | None, float, float]:
    """(model, path(step) -> loss, residual sd, disagreement between the candidate curves)."""
    if lr_steps is not None and lr_values is not None and len(lr_steps) >= 2:
        sched = fit_schedule_aware(s, v, np.asarray(lr_steps), np.asarray(lr_values), end)
        if sched is not None:
            offset = level - float(sched.predict(np.array([s[-1]]))[0])
            return "schedule_aware", lambda x: sched.predict(x) + offset, sched.resid_sd, 0.0
    slope = loglog_slope(s, v)
    fit = fit_power_law(s, v)
    if slope is None and fit is None:
        resid = float(np.std(v)) if len(v) > 1 else 0.0
        return "last_smoothed", None, resid, 0.0
    now = float(s[-1])

    def path(x: np.ndarray) -> np.ndarray:
        x = np.maximum(np.asarray(x, dtype=float), now)
        line = level * np.power(x / now, slope) if slope is not None else None
        if fit is None:
            return line  # type: ignore[return-value]
        curve = fit.predict(x)
        if line is None:
            return curve
        w = _line_weight(x / now)
        return w * line + (1 - w) * curve

    x_end = np.array([end])
    gap = 0.0
    if slope is not None and fit is not None:
        gap = abs(float(level * (end / now) ** slope) - float(fit.predict(x_end)[0]))
    resid_sd = fit.resid_sd if fit is not None else float(np.std(v))
    return "power_law", path, resid_sd, gap


def loglog_slope(s: np.ndarray, v: np.ndarray) -> float | None:
    """Slope of log(loss) against log(step) over the recent part of the prefix (a pure power
    law, no asymptote). Omitting the asymptote makes it steeper far out than a + b*s^-c; on the
    developer set that matches the late drop of the LR anneal most runs end with (see docs)."""
    line = _loglog_line(s, v)
    if line is None:
        return None
    return min(line[0], 0.0)  # a rising recent stretch is divergence's business, not a trend


def _line_weight(ratio: np.ndarray) -> np.ndarray:
    """Weight of the log-log line against the a + b*s^-c fit: full up to LOSS_LOGLOG_FULL_RATIO
    times the current step, then falling to one half far out where the line overshoots."""
    r = np.maximum(ratio, 1.0 + 1e-9)
    w = np.log(th.LOSS_LOGLOG_FULL_RATIO) / np.log(r)
    return np.clip(w, th.LOSS_LOGLOG_MIN_WEIGHT, 1.0)


def _half_width(
    level: float,
    p50: float,
    gap: float,
    resid_sd: float,
    n: int,
    now: float,
    end: float,
) -> float:
    """Half-width of the 80% interval from three independent error sources."""
    horizon = math.log(end / now) if now > 0 and end > now else 0.0
    noise = resid_sd / math.sqrt(max(1, min(n, th.LOSS_LEVEL_MAX_POINTS)))
    # The candidate curves' disagreement and the size of the forecast change are both model risk.
    model_gap = th.LOSS_INTERVAL_GAP_SHARE * max(gap, abs(p50 - level))
    drift = abs(level) * th.LOSS_INTERVAL_REL_PER_LOG_HORIZON * horizon
    # hypot, not sqrt of squares: a loss that blew up to 1e200 is finite, and its square is not
    # (a float ** raises OverflowError where numpy would give inf).
    sd = math.hypot(noise, model_gap, drift)
    return th.LOSS_INTERVAL_Z * sd


def _target(
    target: float | None,
    s: np.ndarray,
    v: np.ndarray,
    level: float,
    path: Callable[[np.ndarray], np.ndarray] | None,
    now: float,
    end: float,
) -> tuple[float | None, bool | None]:
    if target is None:
        return None, None
    if level <= target:
        hit = np.nonzero(v <= target)[0]
        return (float(s[hit[0]]) if len(hit) else now), True
    if path is None or end <= now:
        return None, False
    grid = np.linspace(now, end, th.LOSS_TARGET_GRID)
    hit = np.nonzero(path(grid) <= target)[0]
    if len(hit) == 0:
        return None, False
    return float(grid[hit[0]]), True


def _explain(
    model: str,
    level: float,
    p50: float,
    p10: float,
    p90: float,
    now: float,
    end: float,
    total_steps: float | None,
    target: float | None,
    t_step: float | None,
) -> str:
    names = {
        "power_law": "a power-law fit to the smoothed loss",
        "schedule_aware": "a fit that follows the logged learning-rate schedule",
        "last_smoothed": "the current smoothed loss (too little data for a trend fit)",
    }
    parts = [f"Smoothed loss now {level:.4g} at step {now:,.0f}."]
    if not total_steps or total_steps <= now:
        parts.append("Planned length unknown or reached, so no extrapolation.")
    else:
        parts.append(
            f"By step {end:,.0f}: {p50:.4g} (80% range {p10:.4g} to {p90:.4g}) from {names[model]}."
        )
    if target is not None:
        if t_step is None:
            parts.append(f"Target {target:.4g} is not reached by step {end:,.0f} on this trend.")
        else:
            parts.append(f"Target {target:.4g} reached around step {t_step:,.0f}.")
    return " ".join(parts)
