"""Divergence detection on a loss curve: NaN/Inf, spikes, sustained rise, growing oscillation and
regression to an old level. Flags describe the current (most recent, still relevant) conditions.

Everything works on log-loss (ratios matter, not absolute loss units) and is causal: the score at
point i uses only points before it, so a replay over a prefix gives the same alarms as live use.
Long curves are cut to a recent tail (spikes, oscillation) or block medians (rise, regression),
so a 1M-point curve costs a few milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from forecasting.estimators import thresholds as th
from forecasting.estimators.formatting import money, span
from forecasting.estimators.jsonable import as_json
from forecasting.estimators.smoothing import block_median, keep_latest

# What detect_divergence raises; forecasting.models.Flag.Kind spells the same kinds for storage
# (tests/forecasting/test_divergence.py holds the two together).
KINDS = ("nan", "spike", "rise", "oscillation", "regression")
# Per-layer gradient norm series are logged as grad_norm/<layer> (the client integrations do).
GRAD_NORM_PREFIX = "grad_norm/"


@dataclass
class DivergenceFlag:
    kind: str  # one of KINDS
    onset_step: float
    onset_index: int
    detected_step: float
    severity: float
    explanation: str
    rollback_step: float | None = None
    onset_time: float | None = None
    wasted_s: float | None = None
    cost: float | None = None
    layers_first: list[str] = field(default_factory=list)
    regression_to_step: float | None = None
    # Evaluations the finding has held over (set by detectors that require it in points, so the
    # service need not wait a time window on top).
    sustained_points: int | None = None

    def to_dict(self) -> dict[str, object]:
        return as_json(self)


# ----------------------------------------------------------------------------- scoring


def to_log(values: np.ndarray) -> np.ndarray:
    """Log-loss when the loss is positive (a x2 jump is the same event at 8.0 or at 0.8); for
    losses that can be negative, values scaled by their typical magnitude instead."""
    v = np.asarray(values, dtype=float)
    fin = v[np.isfinite(v)]
    if len(fin) and np.min(fin) > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(v)
    scale = float(np.median(np.abs(fin))) if len(fin) else 1.0
    return v / max(scale, 1e-12)


def spike_scores(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(robust z, excess) of each point of y (log-loss) against the trailing window before it.

    Level: median of the previous SPIKE_WINDOW points. Scale: median absolute first difference
    (insensitive to the downward trend of a loss curve), floored so a flat curve is not
    infinitely sensitive."""
    ser = pd.Series(y)
    prev = ser.shift(1)
    w, m = th.DIV_SPIKE_WINDOW, th.DIV_SPIKE_MIN_HISTORY
    base = prev.rolling(w, min_periods=m).median().to_numpy()
    diffs = prev.diff().abs()
    scale = diffs.rolling(w, min_periods=m - 1).median().to_numpy() / th.DIV_MAD_DIFF_TO_SD
    scale = np.fmax(scale, th.DIV_SCALE_FLOOR)
    excess = y - base
    with np.errstate(invalid="ignore"):
        z = excess / scale
    return z, excess


def spike_alarms(steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Causal spike alarm per point (True where a spike is confirmed at that point).

    A single point pages only when it is extreme (>= DIV_SPIKE_SINGLE_RATIO times the baseline
    and a very high z): one noisy batch pages nobody. Moderate excursions must persist for
    DIV_SPIKE_PERSIST_POINTS consecutive points."""
    del steps  # points are scored in log order; step spacing does not change the rule
    y = to_log(values)
    z, excess = spike_scores(y)
    z = np.nan_to_num(z, nan=0.0)
    excess = np.nan_to_num(excess, nan=0.0)
    single = (z >= th.DIV_SPIKE_Z_SINGLE) & (excess >= math.log(th.DIV_SPIKE_SINGLE_RATIO))
    # On a smooth curve a lone point far beyond anything its noise produces is not a noisy batch.
    single |= (z >= th.DIV_SPIKE_Z_EXTREME) & (excess >= math.log(th.DIV_SPIKE_EXTREME_RATIO))
    high = (z >= th.DIV_SPIKE_Z_PERSIST) & (excess >= math.log(th.DIV_SPIKE_MIN_RATIO))
    k = th.DIV_SPIKE_PERSIST_POINTS
    run = pd.Series(high.astype(float)).rolling(k, min_periods=k).sum().to_numpy()
    persistent = np.nan_to_num(run, nan=0.0) >= k
    return single | persistent


# ----------------------------------------------------------------------------- detection


@dataclass
class _Context:
    steps: np.ndarray
    values: np.ndarray
    times: np.ndarray | None
    checkpoints: list[float]
    gpu_count: int | None
    gpu_hour_price: float | None
    now: float | None
    grad_norms: dict[str, tuple[np.ndarray, np.ndarray]] | None
    currency: str = "USD"


def detect_divergence(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    times: np.ndarray | None = None,
    checkpoints: list[float] | None = None,
    grad_norms: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    gpu_count: int | None = None,
    gpu_hour_price: float | None = None,
    currency: str = "USD",
    now: float | None = None,
    evaluation: bool = False,
) -> list[DivergenceFlag]:
    """Open divergence conditions at the end of the curve, most severe kinds first.

    `evaluation`: the curve is a validation (held-out) loss, logged every few hundred steps and
    averaged over many batches; it is also checked against its own best (`_eval_rise_flag`).
    """
    s = np.asarray(steps, dtype=float).ravel()
    v = np.asarray(values, dtype=float).ravel()
    n = min(len(s), len(v))
    s, v = s[:n], v[:n]
    t = None
    if times is not None:
        t = np.asarray(times, dtype=float).ravel()[:n]
        if len(t) < n:
            t = np.append(t, np.full(n - len(t), np.nan))
    keep = keep_latest(s)  # restarts: the re-logged stretch supersedes the abandoned one
    s, v = s[keep], v[keep]
    t = t[keep] if t is not None else None
    if len(s) == 0:
        return []
    ctx = _Context(
        s, v, t, sorted(checkpoints or []), gpu_count, gpu_hour_price, now, grad_norms, currency
    )
    flags: list[DivergenceFlag] = []
    nan_flag = _nan_flag(ctx)
    if nan_flag is not None:
        flags.append(nan_flag)
    finite = np.isfinite(v)
    fs, fv = s[finite], v[finite]
    if len(fs) >= th.DIV_MIN_POINTS:
        index_map = np.flatnonzero(finite)
        for finder in (_spike_flag, _rise_flag, _oscillation_flag, _regression_flag):
            found = finder(fs, fv)
            if found is not None:
                found.onset_index = int(index_map[found.onset_index])
                flags.append(found)
        if evaluation and not any(f.kind in ("rise", "regression") for f in flags):
            found = _eval_rise_flag(fs, fv)
            if found is not None:
                found.onset_index = int(index_map[found.onset_index])
                flags.append(found)
    for flag in flags:
        _annotate(flag, ctx)
    return flags


def _nan_flag(ctx: _Context) -> DivergenceFlag | None:
    bad = np.flatnonzero(~np.isfinite(ctx.values))
    if len(bad) == 0:
        return None
    last = len(ctx.values) - 1
    if last - bad[-1] > th.DIV_RECENT_POINTS:
        return None  # an isolated non-finite value long ago, training went on: not open
    # The open episode starts after the last long healthy stretch between non-finite points.
    gaps = np.flatnonzero(np.diff(bad) > th.DIV_RECENT_POINTS)
    first = int(bad[gaps[-1] + 1]) if len(gaps) else int(bad[0])
    count = len(bad) - (gaps[-1] + 1 if len(gaps) else 0)
    still = not np.isfinite(ctx.values[-1])
    state = "and is still not finite" if still else "then became finite again"
    return DivergenceFlag(
        kind="nan",
        onset_step=float(ctx.steps[first]),
        onset_index=first,
        detected_step=float(ctx.steps[first]),
        severity=float(count),
        explanation=(
            f"Loss became NaN/Inf at step {ctx.steps[first]:,.0f} ({count} non-finite "
            f"value{'s' if count != 1 else ''}) {state}."
        ),
    )


def _spike_flag(s: np.ndarray, v: np.ndarray) -> DivergenceFlag | None:
    start = max(0, len(v) - th.DIV_TAIL_POINTS)
    ts, tv = s[start:], v[start:]
    alarms = spike_alarms(ts, tv)
    hits = np.flatnonzero(alarms)
    if len(hits) == 0 or len(tv) - 1 - hits[-1] > th.DIV_RECENT_POINTS:
        return None  # no spike, or one that ended long ago
    # Episode = alarms not separated by a long quiet stretch; report its first alarm.
    gaps = np.flatnonzero(np.diff(hits) > th.DIV_EPISODE_GAP_POINTS)
    first_alarm = int(hits[gaps[-1] + 1]) if len(gaps) else int(hits[0])
    y = to_log(tv)
    z, excess = spike_scores(y)
    onset = first_alarm
    while onset > 0 and np.nan_to_num(z[onset - 1]) >= th.DIV_ONSET_Z:
        onset -= 1
    base = float(np.exp(y[onset] - excess[onset])) if np.isfinite(excess[onset]) else float("nan")
    peak = int(first_alarm + np.nanargmax(z[first_alarm:]))
    ratio = float(np.exp(np.nan_to_num(excess[peak])))
    # Judge "still elevated" against the level before onset: the trailing baseline itself
    # absorbs a long spike, so the current z alone would call it over too early.
    recent = float(np.median(y[-th.DIV_SPIKE_PERSIST_POINTS :]))
    pre = y[onset] - excess[onset] if np.isfinite(excess[onset]) else recent
    still = bool(alarms[-1]) or recent - pre >= math.log(th.DIV_SPIKE_MIN_RATIO)
    state = "still elevated" if still else f"back to normal by step {ts[-1]:,.0f}"
    return DivergenceFlag(
        kind="spike",
        onset_step=float(ts[onset]),
        onset_index=start + onset,
        detected_step=float(ts[first_alarm]),
        severity=float(np.nanmax(z[first_alarm:])),
        explanation=(
            f"Loss spiked to {ratio:.2f}x its recent level (~{base:.4g}) from step "
            f"{ts[onset]:,.0f}; {state}."
        ),
    )


def _smoothed(
    s: np.ndarray, v: np.ndarray, bins: int = th.DIV_TREND_BINS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block medians of log-loss (bins of consecutive points) with each bin's mean index."""
    y = to_log(v)
    idx = np.arange(len(y), dtype=float)
    bs, by = block_median(s, y, bins)
    bi, _ = block_median(idx, idx, bins)
    return bs, by, np.round(bi).astype(int)


def level_curve(by: np.ndarray) -> np.ndarray:
    """The loss's level along the run from its block medians (log): a centred rolling median of
    DIV_REGRESSION_LEVEL_BINS of them, so neither one noisy batch nor one odd block is a level
    the run "stood at"."""
    k = th.DIV_REGRESSION_LEVEL_BINS
    return np.asarray(pd.Series(by).rolling(k, center=True, min_periods=1).median().to_numpy())


def last_at_or_above(levels: np.ndarray, level: float) -> int | None:
    """Index of the last smoothed level at or above `level` (where the run last stood this
    high: every step of training since then is undone), or None if it never did."""
    found = np.flatnonzero(levels >= level)
    return int(found[-1]) if found.size else None


def _rise_flag(s: np.ndarray, v: np.ndarray) -> DivergenceFlag | None:
    """One-sided CUSUM on increments of the smoothed log-loss (standardised by their robust
    spread): a healthy curve drifts down, so the sum stays at zero unless the loss keeps rising."""
    start_idx = max(0, len(v) - th.DIV_TAIL_POINTS)
    bs, by, bi = _smoothed(s[start_idx:], v[start_idx:], th.DIV_RISE_BINS)
    bi = bi + start_idx
    if len(by) < th.DIV_RISE_MIN_BINS:
        return None
    d = np.diff(by)
    sd = max(1.4826 * float(np.median(np.abs(d - np.median(d)))), th.DIV_SCALE_FLOOR / 4)
    cusum = peak = 0.0
    start = 0
    for i, inc in enumerate(d / sd):
        cusum = max(0.0, cusum + inc - th.DIV_CUSUM_DRIFT)
        if cusum == 0.0:
            start = i + 1
            peak = 0.0
        peak = max(peak, cusum)
    rise = float(by[-1] - by[start])
    if cusum < th.DIV_CUSUM_LIMIT or rise < math.log(1 + th.DIV_RISE_MIN_FRACTION):
        return None
    if peak - cusum >= th.DIV_CUSUM_LIMIT:
        # The sum has come down from its peak by as much as it takes to raise: the climb ended
        # and the loss falls again (a level still above its best is a regression's to say). A
        # sparse validation curve's steady small decline after a climb leaves the sum high in
        # units of that decline's tiny spread, and it read "still climbing" on a falling curve.
        return None
    detected = _cusum_crossing(d / sd, start)
    return DivergenceFlag(
        kind="rise",
        onset_step=float(bs[start]),
        onset_index=int(bi[start]),
        detected_step=float(bs[min(detected, len(bs) - 1)]),
        severity=float(cusum),
        explanation=(
            f"Loss has been rising since step {bs[start]:,.0f}: up "
            f"{100 * (math.exp(rise) - 1):.1f}% and still climbing (a trend, not a single spike)."
        ),
    )


def _cusum_crossing(z: np.ndarray, start: int) -> int:
    cusum = 0.0
    for i in range(start, len(z)):
        cusum = max(0.0, cusum + z[i] - th.DIV_CUSUM_DRIFT)
        if cusum >= th.DIV_CUSUM_LIMIT:
            return i + 1
    return len(z)


def _oscillation_flag(s: np.ndarray, v: np.ndarray) -> DivergenceFlag | None:
    """Amplitude of the loss around its rolling median in three consecutive recent windows:
    flagged when it grows window over window and the last is several times the first."""
    w = th.DIV_OSC_WINDOW
    if len(v) < 3 * w + th.DIV_SPIKE_WINDOW:
        return None
    y = to_log(v[-(3 * w + th.DIV_SPIKE_WINDOW) :])
    base = pd.Series(y).rolling(th.DIV_OSC_BASE_POINTS, center=True, min_periods=1).median()
    r = (y - base.to_numpy())[-3 * w :]
    amp = [float(np.mean(np.abs(r[k * w : (k + 1) * w]))) for k in range(3)]
    amp0 = max(amp[0], th.DIV_SCALE_FLOOR)
    flips = float(np.mean(np.sign(r[-w:][1:]) != np.sign(r[-w:][:-1])))
    growing = amp[1] > amp0 and amp[2] > amp[1]
    ratio = amp[2] / amp0
    if not growing or ratio < th.DIV_OSC_RATIO or amp[2] < th.DIV_OSC_MIN_AMPLITUDE:
        return None
    if flips < th.DIV_OSC_MIN_FLIPS:
        return None  # one-signed excursions are a spike or a rise, not an oscillation
    onset = len(v) - 2 * w
    return DivergenceFlag(
        kind="oscillation",
        onset_step=float(s[onset]),
        onset_index=onset,
        detected_step=float(s[-1]),
        severity=ratio,
        explanation=(
            f"Loss oscillation is growing: swings now {ratio:.1f}x larger than "
            f"{2 * w} points earlier (about ±{100 * (math.exp(amp[2]) - 1):.1f}%)."
        ),
    )


def _regression_flag(s: np.ndarray, v: np.ndarray) -> DivergenceFlag | None:
    """Current smoothed loss is clearly above the best smoothed loss: report how far back in the
    run it last stood at this level (the progress lost)."""
    bs, by, bi = _smoothed(s, v)
    if len(by) < th.DIV_REGRESSION_MIN_BINS:
        return None
    k = th.DIV_REGRESSION_LEVEL_BINS
    smooth = level_curve(by)
    now_level = float(np.median(by[-k:]))
    best = int(np.argmin(smooth[:-1])) if len(smooth) > 1 else 0
    lost = now_level - float(smooth[best])
    if lost < max(math.log(1 + th.DIV_REGRESSION_MIN_FRACTION), _regression_noise(by, k)):
        return None
    earlier = last_at_or_above(smooth[: best + 1], now_level)
    # Above every smoothed level before the best: all the progress given back and more (a
    # sparse log that starts after the initial loss, an injected climb of +50%). It still needs
    # the best to lie well into the run (below), so a loss rising in its first stretch (warm-up)
    # is not this.
    beyond = earlier is None
    back_to = 0 if earlier is None else earlier
    if bs[best] - bs[back_to] < th.DIV_REGRESSION_MIN_LOST_SHARE * (bs[-1] - bs[0]):
        return None
    tail = np.flatnonzero(smooth[best:] <= smooth[best] + th.DIV_REGRESSION_ONSET_SHARE * lost)
    onset = best + int(tail[-1]) if len(tail) else best
    return DivergenceFlag(
        kind="regression",
        onset_step=float(bs[onset]),
        onset_index=int(bi[onset]),
        detected_step=float(s[-1]),
        severity=float(math.exp(lost)),
        explanation=(
            (
                f"Loss is above every level since step {bs[back_to]:,.0f} "
                if beyond
                else f"Loss is back at its level of step {bs[back_to]:,.0f} "
            )
            + f"({100 * (math.exp(lost) - 1):.1f}% above its best, "
            f"reached at step {bs[best]:,.0f})."
        ),
        regression_to_step=float(bs[back_to]),
    )


def _regression_noise(by: np.ndarray, k: int) -> float:
    """How far above its best a healthy plateau's level stands by chance alone.

    A loss on a noisy plateau (±5-10% batch to batch, as long small-model runs have) keeps
    setting a new smoothed minimum by luck, so "best" is an extreme of many noisy levels: on a
    4-hour run that does not regress (its validation loss falling to the end) the train loss's
    level read 14.7% above its best. Each level is a median of k bins (noise 1.25 sigma/sqrt(k),
    sigma the bins' robust bin-to-bin noise); the minimum of n_eff = n/k independent ones lies
    about sqrt(2 ln n_eff) of that below the mean, and the difference of two levels has
    sqrt(2) of it.
    """
    d = np.diff(by)
    if d.size < 2:
        return 0.0
    sigma_bin = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2.0)
    sigma_level = 1.2533 * sigma_bin / math.sqrt(k)
    n_eff = max(1.0, (len(by) - 1) / k)
    return sigma_level * (
        math.sqrt(2.0 * math.log(n_eff)) + th.DIV_REGRESSION_NOISE_Z * math.sqrt(2)
    )


def _eval_rise_flag(s: np.ndarray, v: np.ndarray) -> DivergenceFlag | None:
    """A validation loss held clearly above its own best for its last few evaluations.

    A validation curve has a dozen to a few hundred points (one per evaluation), each an average
    over many batches: the rise and regression detectors' bins and smoothing need far more points
    than that, and by the time they have them the run is over. Such a curve is smooth, so it is
    compared point by point: the last DIV_EVAL_SUSTAIN_POINTS evaluations must all lie above the
    best one before them by at least DIV_EVAL_MIN_FRACTION and by DIV_EVAL_NOISE_MULT times the
    largest rise between two consecutive evaluations before them. That rise is the curve's own
    noise (a small eval set wobbles up now and then; a healthy curve otherwise only falls), and
    the fall between evaluations is trend, not noise. A climb in small steps is still caught: the
    distance above the best accumulates while the largest single step does not.
    """
    k = th.DIV_EVAL_SUSTAIN_POINTS
    if len(v) < th.DIV_EVAL_MIN_HISTORY + k:
        return None
    y = to_log(v)
    before, last = y[:-k], y[-k:]
    best_i = int(np.argmin(before))
    best = float(before[best_i])
    steps_up = np.diff(before)
    noise = float(np.max(steps_up, initial=0.0))
    need = max(math.log(1 + th.DIV_EVAL_MIN_FRACTION), th.DIV_EVAL_NOISE_MULT * noise)
    excess = float(np.min(last)) - best
    if excess < need:
        return None
    # Onset: the first evaluation after the best one that already stood half the margin above it.
    up = np.flatnonzero(y[best_i + 1 :] - best >= 0.5 * need)
    onset = best_i + 1 + int(up[0]) if up.size else len(y) - k
    rise = float(y[-1] - best)
    return DivergenceFlag(
        kind="rise",
        onset_step=float(s[onset]),
        onset_index=onset,
        detected_step=float(s[-1]),
        severity=float(excess / max(noise, th.DIV_SCALE_FLOOR / 4)),
        explanation=(
            f"Validation loss has risen since step {s[onset]:,.0f}: its last {k} evaluations are "
            f"{100 * (math.exp(excess) - 1):.1f}% or more above its best (step {s[best_i]:,.0f}), "
            f"now {100 * (math.exp(rise) - 1):.1f}% above it."
        ),
        sustained_points=k,
    )


# ----------------------------------------------------------------------------- annotation


def _annotate(flag: DivergenceFlag, ctx: _Context) -> None:
    """Rollback point, onset time, wall time and GPU cost since onset, first-moving layers."""
    before = [c for c in ctx.checkpoints if c < flag.onset_step]
    flag.rollback_step = float(before[-1]) if before else None
    flag.onset_time = _time_at(ctx, flag.onset_step)
    end_time = ctx.now if ctx.now is not None else _last_time(ctx)
    if flag.onset_time is not None and end_time is not None:
        flag.wasted_s = max(0.0, float(end_time) - flag.onset_time)
        if ctx.gpu_count and ctx.gpu_hour_price is not None:
            flag.cost = flag.wasted_s / 3600.0 * ctx.gpu_count * ctx.gpu_hour_price
    if flag.regression_to_step is not None:
        _add_time_ago(flag, ctx, end_time)
    if ctx.grad_norms:
        flag.layers_first = first_moving_layers(ctx.grad_norms, flag.onset_step, flag.detected_step)
    if flag.wasted_s is not None:
        # In the project's currency, as every other cost Runcast shows ("about 37.50" named none).
        cost = (
            f", about {money(flag.cost, ctx.currency)} in GPU cost" if flag.cost is not None else ""
        )
        flag.explanation += f" {span(flag.wasted_s)} of training since onset{cost}."
    if flag.rollback_step is not None:
        flag.explanation += f" Last checkpoint before onset: step {flag.rollback_step:,.0f}."
    if flag.layers_first:
        layers = ", ".join(name.removeprefix(GRAD_NORM_PREFIX) for name in flag.layers_first)
        flag.explanation += f" Gradient norms moved first in {layers}."


def _time_at(ctx: _Context, step: float) -> float | None:
    if ctx.times is None:
        return None
    ok = np.isfinite(ctx.times)
    if ok.sum() < 1:
        return None
    return float(np.interp(step, ctx.steps[ok], ctx.times[ok]))


def _last_time(ctx: _Context) -> float | None:
    if ctx.times is None:
        return None
    ok = np.flatnonzero(np.isfinite(ctx.times))
    return float(ctx.times[ok[-1]]) if len(ok) else None


def _add_time_ago(flag: DivergenceFlag, ctx: _Context, end_time: float | None) -> None:
    """Say how long ago the loss last stood this high, e.g. "its level of 10.2 h ago (step ...)"."""
    step = float(flag.regression_to_step or 0.0)
    then = _time_at(ctx, step)
    if then is None or end_time is None:
        return
    ago = span(max(0.0, end_time - then))
    old = f"its level of step {step:,.0f}"
    flag.explanation = flag.explanation.replace(old, f"its level of {ago} ago (step {step:,.0f})")


def first_moving_layers(
    grad_norms: dict[str, tuple[np.ndarray, np.ndarray]], onset_step: float, detected_step: float
) -> list[str]:
    """grad_norm/<layer> series that departed from their own baseline first around the onset,
    earliest first and, among layers that moved at the same logged step, largest move first."""
    k = th.DIV_SPIKE_PERSIST_POINTS
    moves: list[tuple[float, float, str]] = []
    for name, (g_steps, g_values) in grad_norms.items():
        gs, gv = np.asarray(g_steps, dtype=float), np.asarray(g_values, dtype=float)
        keep = keep_latest(gs)
        gs, gv = gs[keep], gv[keep]
        if len(gs) < th.DIV_MIN_POINTS:
            continue
        lookback = th.DIV_LAYER_LOOKBACK_FRACTION * max(onset_step - float(gs[0]), 1.0)
        # Grad norms are logged every few steps: when the loss pages on its first bad point
        # (onset == detection, e.g. a sudden LR jump), a layer shows the move only at its first
        # sample after the onset and confirms it k - 1 samples later. The window of where a
        # move may start reaches that first sample; the data reach k - 1 samples beyond it to
        # confirm a move, and no further (layers moving later are effects, not causes).
        after = int(np.searchsorted(gs, onset_step, side="left"))
        window_end = max(detected_step, float(gs[after])) if after < len(gs) else detected_step
        # Score only the lookback window (at most the tail size) plus one baseline window.
        hi = min(len(gs), int(np.searchsorted(gs, window_end, side="right")) + k - 1)
        lo = max(int(np.searchsorted(gs, onset_step - lookback)), hi - th.DIV_TAIL_POINTS)
        start = max(0, lo - th.DIV_SPIKE_WINDOW)
        gs, gv = gs[start:hi], gv[start:hi]
        if len(gs) < th.DIV_MIN_POINTS:
            continue
        z, excess = spike_scores(to_log(np.abs(gv)))
        z = np.where(np.isfinite(gv), np.nan_to_num(z, nan=0.0), np.inf)
        window = (gs >= onset_step - lookback) & (gs <= window_end)
        # A move must hold for a few logged points: single noisy readings in a long lookback
        # window would otherwise make random layers look first.
        high = (np.abs(z) >= th.DIV_LAYER_Z).astype(float)
        held = pd.Series(high[::-1]).rolling(k, min_periods=k).sum().to_numpy()[::-1] >= k
        moved = np.flatnonzero(window & held)
        if len(moved):
            # Ties broken by the size of the move (its log ratio to the baseline), not its z:
            # a x40 jump on a noisy layer is the bigger news than x6 on a quiet one.
            size = abs(float(np.nan_to_num(excess[moved[0]], nan=np.inf)))
            moves.append((float(gs[moved[0]]), -size, name))
    if not moves:
        return []
    moves.sort()
    first = moves[0][0]
    # Layers that moved before the loss did, or together with the very first one.
    chosen = [name for step, _, name in moves if step <= max(onset_step, first)]
    return chosen[: th.DIV_LAYERS_MAX]
