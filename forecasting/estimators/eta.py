"""When will a training run finish? A robust pace model plus an interruption model.

Pure numpy. The input is the run's progress points in arrival order: `steps` (may go backwards
after a resume from an earlier checkpoint) and `times` (wall clock; gaps are downtime). The
forecast separates three things a naive "remaining steps / current speed" mixes up:

* compute: the time the remaining steps need at the run's pace. The pace ignores compile
  warm-up, single slow steps and one-off gaps; recurring pauses (eval, checkpoint) are spread
  over the steps as overhead; a pace trend (steps slowing as sequence/window schedules grow)
  is extrapolated, damped. Whether the rise is a ramp or a staircase of stages is decided by
  the run's own back-test.
* interruptions: downtime gaps and rollbacks seen so far give a rate (on a prior that spans
  orders of magnitude, so the run's own record sets the scale) and a mean cost (recovery time
  plus recomputed steps).
* uncertainty: the spread of the compute time comes from the run's own back-test (how wrong
  this model would have been on the part of the run already seen), growing with how far it
  extrapolates; the wall-clock distribution is a Monte Carlo of compute plus future downtime.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np

from forecasting.estimators import calibration
from forecasting.estimators import thresholds as th
from forecasting.estimators.jsonable import plain

Z90 = 1.2815515655446004  # standard normal quantile of 0.9
_TREND_MAX_BINS = 100  # Theil-Sen is quadratic: fit the trend on at most this many super-bins


@dataclass
class EtaForecast:
    now: float
    current_step: float
    total_steps: float
    rate_steps_per_s: float
    compute_p10: float
    compute_p50: float
    compute_p90: float
    wall_p10: float
    wall_p50: float
    wall_p90: float
    interruptions_seen: int
    downtime_s: float
    lost_steps: float
    # Added keys (the service stores to_dict() as is): the forecast rests on little data, and in
    # a few words on what it rests.
    early: bool = False
    basis: str = ""
    # The calibration factor applied to the log spread of the remaining compute (calibration.py).
    interval_scale: float = 1.0

    def finish_p10(self) -> float:
        return self.now + self.wall_p10

    def finish_p50(self) -> float:
        return self.now + self.wall_p50

    def finish_p90(self) -> float:
        return self.now + self.wall_p90

    def to_dict(self) -> dict[str, float | int | bool | str | None]:
        out: dict[str, float | int | bool | str | None] = dict(asdict(self))
        out["finish_p10"] = self.finish_p10()
        out["finish_p50"] = self.finish_p50()
        out["finish_p90"] = self.finish_p90()
        return {k: plain(v) for k, v in out.items()}


@dataclass
class _Timeline:
    """The history re-expressed as work done (steps computed) against compute seconds."""

    work: np.ndarray  # cumulative steps computed, including steps redone after a rollback
    compute: np.ndarray  # cumulative compute seconds (downtime and recurring pauses removed)
    overhead_per_step: float  # recurring pauses (eval, checkpoint) spread over the steps
    interruptions: int
    downtime_s: float
    lost_steps: float
    lost_compute_s: float
    typical_dt: float  # the recent log cadence, for judging silence after the last point


@dataclass
class _Pace:
    level: float  # seconds per step over the recent window
    slope: float  # damped d log(seconds per step) / d work
    w_mid: float  # work at the centre of the recent window


def stitch_resets(times: np.ndarray) -> np.ndarray:
    """Make a clock that restarted (e.g. a timer reset after compile warm-up) monotone again."""
    dt = np.diff(times)
    if not (dt < 0).any():
        return times
    positive = dt[dt > 0]
    fill = float(np.median(positive)) if positive.size else 0.0
    # A reset hides how long the restart took: assume one usual interval, not zero or negative.
    dt = np.where(dt < 0, fill, dt)
    return np.concatenate(([times[0]], times[0] + np.cumsum(dt)))


def _recurring(excess: np.ndarray) -> np.ndarray:
    """Which gaps are the job's own rhythm (several, of similar size) rather than outages."""
    if excess.size < th.ETA_RECURRING_MIN_COUNT:
        return np.zeros(excess.size, dtype=bool)
    med = float(np.median(excess))
    return (excess <= med * th.ETA_RECURRING_SPREAD) & (excess >= med / th.ETA_RECURRING_SPREAD)


def _timeline(steps: np.ndarray, times: np.ndarray) -> _Timeline | None:
    ds = np.diff(steps)
    dt = np.diff(times)
    forward = ds > 0
    if not forward.any():
        return None
    spr_ref = float(np.median(dt[forward] / ds[forward]))
    typical_dt = float(np.median(dt[dt > 0])) if (dt > 0).any() else 0.0
    rollback = ds < 0
    expected = np.clip(ds, 0.0, None) * spr_ref
    excess = dt - expected
    gap = (
        ~rollback
        & (dt > th.ETA_GAP_FACTOR * expected)
        & (excess > th.ETA_GAP_MIN_INTERVALS * typical_dt)
    )
    # Slowness before the first normal interval is start-up (compile, data loader), not an
    # outage: it stays compute time and the warm-up trim keeps it out of the pace.
    normal = forward & ~gap
    first_normal = int(np.argmax(normal)) if normal.any() else ds.size
    gap[:first_normal] = False
    gap_idx = np.flatnonzero(gap)
    recurring = _recurring(excess[gap_idx])
    # A short pause (an eval, a checkpoint save, a burst of contention from other load) is pace
    # noise, not an outage: shorter than a few usual log intervals, or than a few of the job's
    # own recurring pauses, it stays compute time so the pace and its spread include it.
    limit = th.ETA_PAUSE_MAX_INTERVALS * typical_dt
    if recurring.any():
        usual_pause = float(np.median(excess[gap_idx[recurring]]))
        limit = max(limit, th.ETA_PAUSE_MAX_RECURRING * usual_pause)
    short = ~recurring & (excess[gap_idx] < limit)
    gap[gap_idx[short]] = False
    gap_idx, recurring = gap_idx[~short], recurring[~short]
    outage_idx = gap_idx[~recurring]
    pause_total = float(excess[gap_idx[recurring]].sum())
    # Compute time: a gap keeps only the time its steps should have taken; a rollback keeps none
    # (the steps redone after it show up as forward progress later).
    cdt = np.where(gap, expected, np.where(rollback, 0.0, dt))
    dw = np.clip(ds, 0.0, None)
    work = np.concatenate(([0.0], np.cumsum(dw)))
    compute = np.concatenate(([0.0], np.cumsum(cdt)))
    high = np.maximum.accumulate(steps)
    rb_idx = np.flatnonzero(rollback)
    lost = np.clip(high[rb_idx] - steps[rb_idx + 1], 0.0, None)
    recent = dt[-th.STALL_RECENT_INTERVALS :]
    recent = recent[recent > 0]
    return _Timeline(
        work=work,
        compute=compute,
        overhead_per_step=pause_total / work[-1] if work[-1] > 0 else 0.0,
        interruptions=int(outage_idx.size + rb_idx.size),
        downtime_s=float(excess[outage_idx].sum() + dt[rb_idx].sum()),
        lost_steps=float(lost.sum()),
        lost_compute_s=float(lost.sum() * spr_ref),
        typical_dt=float(np.median(recent)) if recent.size else typical_dt,
    )


def _bins(tl: _Timeline) -> tuple[np.ndarray, np.ndarray]:
    """Equal-work bins: grid of work values and the compute time at each."""
    total = float(tl.work[-1])
    n_forward = int((np.diff(tl.work) > 0).sum())
    nb = max(1, min(th.ETA_MAX_BINS, n_forward))
    grid = np.linspace(0.0, total, nb + 1)
    # Keep the last point of each plateau so interp sees strictly increasing work.
    keep = np.flatnonzero(np.diff(tl.work, append=np.inf) > 0)
    return grid, np.interp(grid, tl.work[keep], tl.compute[keep])


def _warmup_end(spr: np.ndarray) -> int:
    """Index of the first bin after the warm-up (leading bins much slower than usual)."""
    med = float(np.median(spr))
    slow = spr > th.ETA_WARMUP_FACTOR * med
    limit = int(th.ETA_WARMUP_MAX_FRACTION * spr.size)
    if not slow[0]:
        return 0
    first_fast = int(np.argmin(slow)) if not slow.all() else spr.size
    return min(first_fast, limit)


def _theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Robust slope and its standard error (from the scatter around the robust line)."""
    i, j = np.triu_indices(x.size, k=1)
    dx = x[j] - x[i]
    ok = dx > 0
    if not ok.any():
        return 0.0, math.inf
    slope = float(np.median((y[j] - y[i])[ok] / dx[ok]))
    resid = y - slope * x
    resid = resid - np.median(resid)
    spread = float(np.sum((x - x.mean()) ** 2))
    dof = max(1, x.size - 2)
    se = math.sqrt(float(np.sum(resid**2)) / dof / spread) if spread > 0 else math.inf
    return slope, se


def _super_bins(grid: np.ndarray, cg: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, ...]:
    """At most _TREND_MAX_BINS groups of bins: edges (bin indices), centres, log pace."""
    groups = min(hi - lo, _TREND_MAX_BINS)
    edges = np.unique(np.linspace(lo, hi, groups + 1).round().astype(int))
    spr = np.diff(cg[edges]) / np.diff(grid[edges])
    centres = 0.5 * (grid[edges[:-1]] + grid[edges[1:]])
    with np.errstate(divide="ignore"):
        return edges, centres, np.log(spr)


def _trend(centres: np.ndarray, logp: np.ndarray) -> float:
    """Slope of log(seconds per step) against work, 0 unless it is real.

    Only a clearly positive slope is kept: steps that get slower follow schedules (sequence
    length, attention window, batch ramp) that keep going, while a run getting faster is almost
    always a warm-up that is ending, which must not be extrapolated.
    """
    if logp.size < 2 * th.ETA_RECENT_MIN_BINS or not np.isfinite(logp).all():
        return 0.0
    slope, se = _theil_sen(centres, logp)
    return slope if slope > th.ETA_TREND_MIN_T * se else 0.0


def _regime_start(
    logp: np.ndarray, centres: np.ndarray, slope: float, starts: list[int] | None = None
) -> int:
    """Index of the first super-bin of the current pace regime (after the last level shift).

    Each split is a two-sample test on the detrended log pace; the noise scale comes from
    successive differences, which a level shift barely touches.
    """
    m = th.ETA_RECENT_MIN_BINS
    m_new = th.ETA_SHIFT_MIN_NEW_BINS
    if logp.size < m + m_new or not np.isfinite(logp).all():
        return 0
    r = logp - slope * centres
    d = np.diff(r)
    sigma = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2.0)
    sigma = max(sigma, 1e-4)  # a perfectly regular log must not turn rounding into a shift
    start = 0
    while r.size - start >= m + m_new:
        seg = r[start:]
        n = seg.size
        j = np.arange(m, n - m_new + 1)
        csum = np.concatenate(([0.0], np.cumsum(seg)))
        left = csum[j] / j
        right = (csum[n] - csum[j]) / (n - j)
        t = np.abs(right - left) / (sigma * np.sqrt(1.0 / j + 1.0 / (n - j)))
        # A shift must also hold for the median of the new regime, and a short one (two or three
        # bins) in every bin: one slow bin (an eval step, a GC pause) near the end of the log
        # would otherwise pull a mean far enough to open a regime by itself. The check only
        # lowers a split's score, so splits are checked from the highest score down and the
        # search stops once no unchecked split can beat the best checked one: the same split as
        # checking every significant one (a median each: quadratic on a long log with a shift,
        # which made each forecast 13x slower), in a few medians.
        best, best_t = 0, -math.inf
        for i in np.argsort(-t, kind="stable"):
            if t[i] < th.ETA_SHIFT_MIN_T or t[i] < best_t:
                break
            tail = seg[j[i] :] - left[i]
            if tail.size >= m:
                robust = float(np.median(tail))
            elif (tail > 0).all() or (tail < 0).all():
                robust = float(tail[np.argmin(np.abs(tail))])
            else:
                robust = 0.0
            checked = min(t[i], abs(robust) / (sigma * math.sqrt(1.0 / j[i] + 1.0 / (n - j[i]))))
            if checked > best_t or (checked == best_t and i < best):
                best, best_t = int(i), checked
        if best_t < th.ETA_SHIFT_MIN_T:
            break
        start += int(j[best])
        if starts is not None:
            starts.append(start)
    return start


def _pace_history(grid: np.ndarray, cg: np.ndarray, lo: int) -> tuple[list[float], float]:
    """What the run's own history says about how its pace moves: the log sizes of the level
    shifts seen after the warm-up, and the bin-to-bin noise of its log pace (robust, from
    successive differences, so a shift barely touches it)."""
    hi = grid.size - 1
    if hi - lo < 2:
        return [], 0.0
    _edges, centres, logp = _super_bins(grid, cg, lo, hi)
    if not np.isfinite(logp).all():
        return [], 0.0
    d = np.diff(logp)
    noise = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2.0) if d.size else 0.0
    starts: list[int] = []
    _regime_start(logp, centres, 0.0, starts)
    bounds = [0, *starts, logp.size]
    levels = [float(np.median(logp[a:b])) for a, b in itertools.pairwise(bounds)]
    return [b - a for a, b in itertools.pairwise(levels)], noise


def _fit(grid: np.ndarray, cg: np.ndarray, lo: int, hi: int, ramp: bool = False) -> _Pace | None:
    """Pace over bins [lo, hi): mean of the current regime plus a damped trend.

    Two readings of a pace that rises: `ramp=False` (steps) finds the current regime on the raw
    pace and keeps only a clearly significant trend inside it; `ramp=True` (a schedule that keeps
    lengthening steps, e.g. an attention-window warm-up in small increments) fits the trend over
    the whole history and looks for level shifts around it. Which one describes a run is decided
    by its own back-test (`_choose`), not by a threshold.
    """
    if hi - lo < 1:
        return None
    edges, centres, logp = _super_bins(grid, cg, lo, hi)
    if ramp:
        if logp.size < 2 * th.ETA_RECENT_MIN_BINS or not np.isfinite(logp).all():
            return None
        raw_slope = max(0.0, _theil_sen(centres, logp)[0])
        # A staircase (batch-size stages) also rises on the whole, but is flat since its last
        # step: when the current regime is clearly flatter than the ramp, the ramp has ended.
        last = _regime_start(logp, centres, 0.0)
        if logp.size - last >= 2 * th.ETA_RECENT_MIN_BINS:
            now_slope, now_se = _theil_sen(centres[last:], logp[last:])
            if raw_slope - now_slope > th.ETA_RAMP_ENDED_T * now_se:
                return None
        first = _regime_start(logp, centres, raw_slope)
        damping = th.ETA_RAMP_DAMPING
    else:
        first = _regime_start(logp, centres, 0.0)
        raw_slope = _trend(centres[first:], logp[first:])
        damping = th.ETA_TREND_DAMPING
    start = int(edges[first])
    level = _regime_level(grid, cg, lo, start, hi)
    if not (level > 0 and math.isfinite(level)):
        return None
    return _Pace(level=level, slope=damping * raw_slope, w_mid=0.5 * (grid[hi] + grid[start]))


def _regime_level(grid: np.ndarray, cg: np.ndarray, lo: int, start: int, hi: int) -> float:
    """Seconds per step of the regime [start, hi): its typical (median) bin pace times the
    run's pause overhead (mean / median pace of every bin since the warm-up).

    Pauses (an eval, a checkpoint, brief contention) are pace noise that recurs at the run's
    rate, not the regime's: its plain mean took a regime of a few bins that happened to open
    with two paused ones (20 s and 14 s a step against 7.6 s) for a 47% slower run, and a
    healthy 103-hour run's cutoff for 41% likely (issue 9's flag stream). Over a long regime the
    two agree; a slower regime still shows in its median.
    """
    span = grid[hi] - grid[start]
    mean = (cg[hi] - cg[start]) / span if span > 0 else 0.0
    bins = np.diff(cg[lo : hi + 1]) / np.diff(grid[lo : hi + 1])
    if bins.size == 0 or not np.isfinite(bins).all():
        return mean
    regime = bins[start - lo :]
    if regime.size == 2 and start > lo:
        # A new regime of two bins is as far as both confirm (the bin nearer the pace before
        # it), the size `_regime_start` admitted it at: their median is their mean, and one
        # checkpoint save followed by a normal bin read as a 25% slower run.
        before = float(np.median(bins[: start - lo]))
        typical = float(regime[np.argmin(np.abs(np.log(regime / before)))]) if before > 0 else 0.0
    else:
        typical = float(np.median(regime))
    # Each bin against the typical pace around it (a running median: stages move it, a pause
    # does not), so the overhead is the pauses' alone.
    half = th.ETA_PAUSE_WINDOW // 2
    padded = np.pad(bins, half, mode="edge")
    local = np.median(np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1), axis=1)
    if not (typical > 0 and (local > 0).all()):
        return mean
    return typical * float(np.mean(bins / local))


def _integrate(pace: _Pace, start: float, amount: float) -> float:
    """Seconds to compute `amount` steps starting at work `start` under the pace model."""
    if amount <= 0:
        return 0.0
    end = start + amount
    slope = pace.slope
    reach = abs(end - pace.w_mid)
    cap = math.log(th.ETA_TREND_MAX_FACTOR)
    if reach > 0 and abs(slope) * reach > cap:
        slope = math.copysign(cap / reach, slope)
    if abs(slope) * amount < 1e-9:
        return pace.level * amount
    a = slope * (start - pace.w_mid)
    b = slope * (end - pace.w_mid)
    return pace.level * (math.exp(b) - math.exp(a)) / slope


def _backtest(grid: np.ndarray, cg: np.ndarray, lo: int, ramp: bool) -> list[float]:
    """Log errors per unit of extrapolation of one pace model, back-tested on the run so far."""
    hi = grid.size - 1
    units: list[float] = []
    for frac in th.ETA_BACKTEST_ORIGINS:
        split = lo + round(frac * (hi - lo))
        # Scored on one or two bins, a back-test measures those bins' noise (one checkpoint
        # save), and dividing it by so short a horizon turns it into a drift: one 46-s save in
        # a sparse MLPerf log took the P90 from +0.16 to +0.76 (log) and the cutoff of a run
        # with 50% to spare to 74% likely (issue 9's last flip-flop). Both sides need a regime.
        if split - lo < th.ETA_RECENT_MIN_BINS or hi - split < th.ETA_RECENT_MIN_BINS:
            continue
        pace = _fit(grid, cg, lo, split, ramp)
        if pace is None:
            continue
        seen = grid[split] - grid[lo]
        ahead = grid[hi] - grid[split]
        predicted = _integrate(pace, grid[split], ahead)
        actual = cg[hi] - cg[split]
        if predicted > 0 and actual > 0 and seen > 0:
            units.append(math.log(actual / predicted) / (ahead / seen))
    return units


def _choose(grid: np.ndarray, cg: np.ndarray, lo: int) -> tuple[_Pace | None, list[float], str]:
    """The pace model (steps or ramp) with the smaller back-test error on this run, its
    back-test errors and its name. Steps wins ties and whenever the ramp has fewer than two
    back-tests (a ramp that ended, or too short a history to tell)."""
    hi = grid.size - 1
    steps_units = _backtest(grid, cg, lo, ramp=False)
    ramp_units = _backtest(grid, cg, lo, ramp=True)
    if len(ramp_units) >= 2 and (
        not steps_units or np.mean(np.square(ramp_units)) < np.mean(np.square(steps_units))
    ):
        ramp_pace = _fit(grid, cg, lo, hi, ramp=True)
        if ramp_pace is not None:
            return ramp_pace, ramp_units, "ramp"
    return _fit(grid, cg, lo, hi), steps_units, "steps"


def _early_pace(grid: np.ndarray, cg: np.ndarray, lo: int) -> _Pace | None:
    """The damped pace of an early forecast: the mean since the warm-up, no regime, no trend.

    With a handful of intervals a level-shift test or a trend follows the last one or two of
    them, so consecutive forecasts jump by the ratio of two step times. The mean moves by at
    most (x - 1) / n when an interval x times the mean is added to n of them.
    """
    hi = grid.size - 1
    span = grid[hi] - grid[lo]
    level = (cg[hi] - cg[lo]) / span if span > 0 else 0.0
    if not (level > 0 and math.isfinite(level)):
        return None
    return _Pace(level=level, slope=0.0, w_mid=0.5 * (grid[hi] + grid[lo]))


def _sigma_per_ratio(units: list[float]) -> float:
    """Log error per unit of extrapolation: the back-test errors pooled with a prior."""
    prior_w = th.ETA_SIGMA_PRIOR_WEIGHT
    total = prior_w * th.ETA_SIGMA_PER_RATIO_PRIOR**2 + sum(u * u for u in units)
    return math.sqrt(total / (prior_w + len(units)))


def _clean(steps: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    s = np.asarray(steps, dtype=float).ravel()
    t = np.asarray(times, dtype=float).ravel()
    if s.size != t.size:
        return None
    ok = np.isfinite(s) & np.isfinite(t)
    s, t = s[ok], t[ok]
    if s.size < th.ETA_MIN_POINTS:
        return None
    return s, t


def _interruption_rates(
    seen: int, observed_wall: float, rng: np.random.Generator, n: int
) -> np.ndarray:
    """Draws of the interruption rate (per second) given `seen` events in `observed_wall` s.

    The rate of a job is unknown by orders of magnitude (a flaky spot instance: several an hour;
    a healthy reserved node: one a month), so the prior is log-uniform over that range and the
    run's own record picks the scale: two outages in the first hour of a job say far more about
    its next hour than any fleet average does, and a week without one rules out the high rates.
    """
    grid = np.geomspace(th.ETA_RATE_MIN_PER_S, th.ETA_RATE_MAX_PER_S, th.ETA_RATE_GRID)
    # Poisson likelihood r^k exp(-r T) on the grid, in logs to stay finite for long runs.
    loglik = seen * np.log(grid) - grid * max(observed_wall, 0.0)
    # Flat (per decade) up to the typical rate, thinning as 1/rate above it: a fresh run that
    # has not failed yet is presumed healthy, while repeated failures still reach high rates.
    loglik -= np.log1p(grid / th.ETA_RATE_TYPICAL_PER_S)
    weights = np.exp(loglik - loglik.max())
    idx = rng.choice(grid.size, size=n, p=weights / weights.sum())
    # Spread each draw within its grid cell so the rate is continuous, not 40 values.
    step = math.log(grid[1] / grid[0]) if grid.size > 1 else 0.0
    return grid[idx] * np.exp(step * (rng.random(n) - 0.5))


def _pace_change_factor(
    shifts: list[float],
    share_seen: float,
    share_left: float,
    centred: bool,
    rng: np.random.Generator,
    n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Draws of the factor by which future pace changes stretch the remaining compute: without
    and with the drift of a run that has been slowing down (same draws, so paired).

    A run's step time changes in steps (batch-size or sequence stages, a throttled or swapped
    node, contention), which no fit of the past can place. Changes arrive as a Poisson process
    over the run's progress, at a rate with a gamma prior (ETA_CHANGE_PRIOR_COUNT changes per
    run, worth ETA_CHANGE_PRIOR_RUNS runs of observation) updated by the shifts this run has
    shown: the chance of another change grows with the share of the run still to go, and a run
    that has changed pace before is expected to change again. Each change multiplies the pace
    from a uniform point of the remaining part on by exp(J), J normal with the size of the
    run's own shifts pooled with a prior.

    The second set of draws centres J on the run's mean shift when that is a slowdown: a run
    that slowed down in stages (batch-size or sequence schedules) is about to slow down again,
    not as likely to speed up; drawn around zero, its next stage sat outside the 80% interval in
    half the NanoGPT records (issue 9). A run that sped up has no drift: that is a warm-up
    ending, which does not repeat. Nor has an early forecast (`centred=False`): a "shift" among
    a handful of intervals is one slow batch, not a stage.
    """
    k = len(shifts)
    shape = th.ETA_CHANGE_PRIOR_COUNT + k
    rate = th.ETA_CHANGE_PRIOR_RUNS + max(share_seen, 0.0)
    lam = rng.gamma(shape, 1.0 / rate, n)
    count = np.minimum(rng.poisson(lam * max(share_left, 0.0)), th.ETA_CHANGE_MAX_DRAWN)
    w0 = th.ETA_CHANGE_PRIOR_WEIGHT
    prior = w0 * th.ETA_CHANGE_PRIOR_LOG**2
    tau = math.sqrt((prior + sum(x * x for x in shifts)) / (w0 + k))
    # The sum of the shifts is the net change since the first regime; the prior's weight shrinks
    # the mean per change towards zero, and the spread is then taken around that mean.
    mu = max(0.0, sum(shifts) / (w0 + k)) if centred else 0.0
    tau_mu = math.sqrt((prior + sum((x - mu) ** 2 for x in shifts)) / (w0 + k))
    m = int(count.max()) if n else 0
    if m == 0:
        return np.ones(n), np.ones(n)
    pos = np.sort(rng.random((n, m)), axis=1)  # where each change falls in the remaining part
    z = rng.standard_normal((n, m))
    active = np.arange(m) < count[:, None]
    seg = np.diff(np.concatenate((pos, np.ones((n, 1))), axis=1), axis=1)

    def stretch(jumps: np.ndarray) -> np.ndarray:
        level = np.exp(np.cumsum(np.where(active, jumps, 0.0), axis=1))  # pace after each change
        return pos[:, 0] + np.sum(seg * level, axis=1)

    plain = stretch(tau * z)
    return plain, (stretch(mu + tau_mu * z) if mu > 0 else plain)


def _wall_quantiles(
    compute_p50: float,
    sigma: float,
    tl: _Timeline,
    observed_wall: float,
    change: tuple[list[float], float, float, bool] = ([], 1.0, 0.0, False),
    scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Monte Carlo of compute time (fit error, future pace changes) plus downtime from future
    interruptions.

    The drift of a run that slows down in stages reaches the P90 only: P10 and the point
    forecast stay those of the undrifted draws. Moving the median too cost accuracy (median
    error at 75% of the developer runs 0.6% -> 1.4%) where many small regime changes net out
    slightly slower, while the stage it is meant for is a risk, not a certainty."""
    rng = np.random.default_rng(th.ETA_MC_SEED)
    n = th.ETA_MC_SAMPLES
    base = compute_p50 * np.exp(sigma * rng.standard_normal(n))
    plain, drift = _pace_change_factor(*change, rng, n)
    compute, slow = base * plain, base * drift
    if compute_p50 > 0:  # calibrated log spread
        compute = compute_p50 * np.power(compute / compute_p50, scale)
        slow = compute_p50 * np.power(slow / compute_p50, scale)
    seen = tl.interruptions
    rate = _interruption_rates(seen, observed_wall, rng, n)
    count = rng.poisson(np.minimum(rate * compute, 1e6))  # cap: numpy's Poisson limit
    w = th.ETA_PRIOR_RECOVERY_WEIGHT
    recovery = (w * th.ETA_PRIOR_RECOVERY_S + tl.downtime_s) / (w + seen)
    lost = tl.lost_compute_s / (1.0 + seen)  # prior: no lost work, worth one interruption
    cost_mean = recovery + lost
    has = count > 0
    extra = np.zeros(n)
    if cost_mean > 0 and has.any():
        extra[has] = rng.gamma(count[has].astype(float), cost_mean)
    wall = compute + extra
    comp_q, wall_q = np.quantile(np.stack((compute, wall)), [0.1, 0.5, 0.9], axis=1).T
    comp_q[2], wall_q[2] = np.maximum(
        (comp_q[2], wall_q[2]), np.quantile(np.stack((slow, slow + extra)), 0.9, axis=1)
    )
    # The point forecast stays the compute median (exact for a steady run): MC noise must not
    # move it, nor put a quantile on the wrong side of it.
    comp_q = np.array([min(comp_q[0], compute_p50), compute_p50, max(comp_q[2], compute_p50)])
    return comp_q, wall_q


def forecast_eta(
    steps: np.ndarray,
    times: np.ndarray,
    total_steps: float | None,
    *,
    now: float | None = None,
) -> EtaForecast | None:
    """Forecast the remaining time of a run, or None when there is nothing to forecast from."""
    if total_steps is None or not math.isfinite(total_steps) or total_steps <= 0:
        return None
    cleaned = _clean(steps, times)
    if cleaned is None:
        return None
    s, raw_t = cleaned
    t = stitch_resets(raw_t)
    # A clock that is no time (NaN, infinite) says nothing about a silence since the last point.
    now_raw = float(now) if now is not None and math.isfinite(now) else float(raw_t[-1])
    # Keep "now" on the caller's clock while the model runs on the stitched one.
    silence = max(0.0, now_raw - float(raw_t[-1]))
    tl = _timeline(s, t)
    if tl is None:
        return None
    grid, cg = _bins(tl)
    spr = np.diff(cg) / np.diff(grid)
    lo = _warmup_end(spr)
    seen_intervals = int(spr.size - lo)
    share_seen = float(grid[-1] - grid[lo]) / float(total_steps)
    early = seen_intervals < th.ETA_EARLY_MIN_INTERVALS or share_seen < th.ETA_EARLY_MIN_SHARE
    if early:
        pace, units, model = _early_pace(grid, cg, lo), list[float](), "mean"
    else:
        pace, units, model = _choose(grid, cg, lo)
    if pace is None:
        return None
    basis = (
        f"{'early: ' if early else ''}{model} pace from {seen_intervals} intervals "
        f"({share_seen:.0%} of the steps)"
    )
    current = float(s[-1])
    remaining = max(0.0, float(total_steps) - current)
    work_now = float(grid[-1])
    compute = _integrate(pace, work_now, remaining) + tl.overhead_per_step * remaining
    # Progress probably continued during a short silence; a long one is downtime in progress.
    compute = max(0.0, compute - min(silence, th.ETA_SILENCE_INTERVALS * tl.typical_dt))
    observed = float(grid[-1] - grid[lo])
    ratio = remaining / observed if observed > 0 else 10.0
    unit = _sigma_per_ratio(units)
    shifts, noise = _pace_history(grid, cg, lo)
    # The run's own bin-to-bin pace noise, averaged over the bins still to come, is the least
    # uncertainty there is; the back-test error per unit of extrapolation adds to it.
    bin_work = observed / max(1, grid.size - 1 - lo)
    floor = max(th.ETA_SIGMA_FLOOR, noise * math.sqrt(bin_work / remaining) if remaining > 0 else 0)
    sigma = min(th.ETA_SIGMA_MAX, math.hypot(floor, unit * ratio))
    share_left = remaining / float(total_steps)
    scale = calibration.scale_at(current / float(total_steps), calibration.ETA_SCALE)
    comp_q, wall_q = _wall_quantiles(
        compute,
        sigma,
        tl,
        float(t[-1] - t[0]) + silence,
        (shifts, share_seen, share_left, not early),
        scale,
    )
    # Sampling noise must not put the wall clock ahead of the compute it contains.
    wall_q = np.maximum(wall_q, comp_q)
    pace_now = pace.level * math.exp(pace.slope * (work_now - pace.w_mid))
    return EtaForecast(
        now=now_raw,
        current_step=current,
        total_steps=float(total_steps),
        rate_steps_per_s=1.0 / (pace_now + tl.overhead_per_step),
        compute_p10=float(comp_q[0]),
        compute_p50=float(comp_q[1]),
        compute_p90=float(comp_q[2]),
        wall_p10=float(wall_q[0]),
        wall_p50=float(wall_q[1]),
        wall_p90=float(wall_q[2]),
        interruptions_seen=tl.interruptions,
        downtime_s=tl.downtime_s,
        lost_steps=tl.lost_steps,
        early=early,
        basis=basis,
        interval_scale=scale,
    )
