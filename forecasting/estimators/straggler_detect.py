"""Which rank (or host) does a synchronous job wait for, since when, and what does it cost?

In synchronous data parallelism every rank waits in the collective for the slowest one, so the
total step time is the same on all ranks and says nothing about who is slow. The signal is each
rank's own compute time (or its wait inside the collective: the straggler waits least).

Input is a steps x ranks matrix; everything is vectorised over ranks.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forecasting.estimators import thresholds as th
from forecasting.estimators.jsonable import plain
from forecasting.estimators.rowwise import accumulate_down, flat_nanmedian, nanmedian, running_sums


@dataclass(frozen=True)
class Straggler:
    kind: str  # "rank" | "host" | "last_arrival"
    ranks: tuple[int, ...]
    host: str | None
    onset_step: int
    # How much slower its compute is than at its normal pace (its own level before the onset,
    # or the median rank's when it was slow from the start): 0.23 = 23% slower.
    slowdown: float
    # Job time lost so far because every rank waited for it (seconds, in compute_s's unit).
    cost_s: float
    steps_affected: int
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ranks": list(self.ranks),
            "host": self.host,
            "onset_step": self.onset_step,
            "slowdown": plain(self.slowdown),
            "cost_s": plain(self.cost_s),
            "steps_affected": self.steps_affected,
            "evidence": plain(self.evidence),
        }


@dataclass(frozen=True)
class StragglerReport:
    stragglers: list[Straggler]
    median_step_s: float  # recent step time of the median rank (compute + comm)
    job_step_s: float  # recent actual job step time (the slowest rank governs)
    whatif_step_s: float  # job step time if the stragglers ran at their normal pace

    def whatif_factor(self) -> float:
        """whatif_step_s / job_step_s (<= 1): multiply the remaining time by it."""
        if not (np.isfinite(self.job_step_s) and self.job_step_s > 0):
            return 1.0
        if not np.isfinite(self.whatif_step_s):
            return 1.0
        return float(min(1.0, max(0.0, self.whatif_step_s / self.job_step_s)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "stragglers": [s.to_dict() for s in self.stragglers],
            "median_step_s": plain(self.median_step_s),
            "job_step_s": plain(self.job_step_s),
            "whatif_step_s": plain(self.whatif_step_s),
            "whatif_factor": self.whatif_factor(),
        }


EMPTY = StragglerReport([], float("nan"), float("nan"), float("nan"))


def _validate(
    steps: np.ndarray,
    compute_s: np.ndarray,
    hosts: Sequence[str] | None,
    wait_s: np.ndarray | None,
    total_s: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    steps = np.asarray(steps, dtype=float)
    compute = np.asarray(compute_s, dtype=float)
    if steps.ndim != 1:
        raise ValueError("steps: expected shape (n,)")
    if compute.ndim != 2 or compute.shape[0] != steps.shape[0]:
        raise ValueError(
            f"compute_s: expected shape ({steps.shape[0]}, ranks), got {compute.shape}"
        )
    if hosts is not None and len(hosts) != compute.shape[1]:
        raise ValueError(f"hosts: expected {compute.shape[1]} names, got {len(hosts)}")
    extra: list[np.ndarray | None] = []
    for name, arr in (("wait_s", wait_s), ("total_s", total_s)):
        if arr is None:
            extra.append(None)
            continue
        a = np.asarray(arr, dtype=float)
        if a.shape != compute.shape:
            raise ValueError(f"{name}: expected shape {compute.shape}, got {a.shape}")
        extra.append(a)
    # A row without a finite step has no place on the job's timeline (its stride, the steps a
    # finding affects): left out, as a row no rank reported.
    placed = np.isfinite(steps)
    if not placed.all():
        steps, compute = steps[placed], compute[placed]
        extra = [None if a is None else a[placed] for a in extra]
    return steps, compute, extra[0], extra[1]


@dataclass
class Scan:
    """A causal CUSUM scan of series (rows x series): what a detector called at each row saw.

    `above[t, j]`: series j is in alarm at row t; `start[t, j]`: the row its current excursion
    began (the change-point estimate); `current[j]`: still in alarm at the last row (not a past,
    recovered episode); `level[j]`: the series' own level (log) before its excursion.
    """

    above: np.ndarray
    start: np.ndarray
    current: np.ndarray
    level: np.ndarray
    sigma: np.ndarray
    by_level: np.ndarray  # the current alarm is the absolute level test's alone
    start_end: np.ndarray  # (CUSUMs, series): where each CUSUM's excursion began, last row


def _longrun_noise(dev: np.ndarray, point: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Noise of a shift that lasts b rows, for each block length b: the spread of b-row moving
    means x sqrt(b), and never less than at shorter blocks. Rows are autocorrelated and ranks
    of a shared cluster wander (a rank's level drifts 5-9% over tens of rows in the trace), so
    the noise a slow, small shift must beat is larger than the row noise says.

    Returns it (blocks x series), and the mean square of each series' block means x b (batch
    means: NaN where the block is too long to measure; `_pooled_noise` pools them).
    """
    out = np.empty((len(th.STRAGGLER_BLOCK_ROWS), dev.shape[1]))
    mean_sq = np.full_like(out, np.nan)
    longrun = point * th.STRAGGLER_LONGRUN_MIN_FACTOR
    filled = np.where(np.isfinite(dev), dev, 0.0)
    csum = running_sums(filled)
    for i, b in enumerate(th.STRAGGLER_BLOCK_ROWS):
        if dev.shape[0] >= th.STRAGGLER_MEASURED_BLOCKS * b:
            # Overlapping means are strongly correlated: every quarter block is as good as all,
            # and a few hundred of them are as good as thousands. The means are over contiguous
            # rows: means of an evenly thinned history would be means over longer spans, and
            # read as b rows they understate the noise (a 64-rank world of 2,000 quiet rows had
            # 9.6 false alarms per job-day that way).
            step = max(1, b // 4, (dev.shape[0] - b + 1) // th.STRAGGLER_LEVEL_MAX_ROWS)
            at = np.arange(0, dev.shape[0] - b + 1, step)
            means = (csum[at + b] - csum[at]) / b
            centred = means - nanmedian(means, axis=0)
            spread = 1.4826 * nanmedian(np.abs(centred), axis=0)
            longrun = np.fmax(longrun, spread * np.sqrt(b))
            # Winsorised at a few of the pooled MADs: a moderate heavy tail is noise a CUSUM
            # must beat, a straggler episode in the history (job 1's rank 6) is not.
            cut = th.STRAGGLER_WINSOR_MADS * 1.4826 * flat_nanmedian(np.abs(centred))
            mean_sq[i] = np.nanmean(np.clip(centred, -cut, cut) ** 2, axis=0) * b
        elif i > 0:
            # Too few rows for this block: extrapolate (STRAGGLER_NOISE_GROWTH_EXP says why
            # not as a random walk). Extrapolating at the growth seen between shorter blocks of
            # the history itself was tried: job 1's ranks 0-2 then alarm on a real 5% drift at
            # row 77, from 48 rows of history.
            growth = (b / th.STRAGGLER_BLOCK_ROWS[i - 1]) ** th.STRAGGLER_NOISE_GROWTH_EXP
            longrun = longrun * growth
        out[i] = longrun
    return out, mean_sq


def _pooled_noise(
    longrun: np.ndarray, mean_sq: np.ndarray, point: np.ndarray, rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each series' long-run noise (blocks x series) from the pool's, and the pool's (blocks).

    Ranks of one job, read in its cross-rank scale, share their noise, and a series' own
    long-run noise from a dozen block means is mostly sampling error (its log is off by ~1.17 /
    sqrt(1.5 rows / b), a MAD's over overlapping means, which are worth ~1.5x as many
    independent ones: Meketon & Schmeiser 1984). It was the larger of its own and the pool's
    median: the maximum of the pool and a noisy estimate sits above the noise for half the
    series by their sampling error, and the thresholds go with its square. Now:

    - The pool is the root mean square of the block means of the series that share it (batch
      means), never less than at shorter blocks nor than the series' median MAD; a block too
      long to measure is extrapolated from the longest measured as the MADs are. A CUSUM sums
      the rows, so its threshold needs the variance of block means, which a MAD reads right
      only for normal ones (the synthetic worlds' have 2-12% more spread than their MAD).
    - A series differs from the pool by what its row noise (`point`, from every row: a far
      smaller sampling error) says beyond sampling error, empirical Bayes on the log noise
      (James-Stein): the series' log row noises spread by tau (robustly), only the excess
      tau^2 - se^2 is real, and each keeps that share of its distance to the middle. The
      long-run / row noise ratio (the autocorrelation) is the pool's.
    - A series more than STRAGGLER_NOISE_OUTLIER_SE standard errors noisier than the middle,
      in its row noise or in its own long-run noise, is truly noisier (a noisy host: a
      minority the robust tau does not see) and keeps the larger of its own and the pool's
      scaled by its row noise, as robust empirical Bayes gives outlying variances their own
      (Phipson et al. 2016).
    """
    out = np.full_like(longrun, np.nan)
    pool = np.full(longrun.shape[0], np.nan)
    zp = np.log(point)
    okp = np.isfinite(zp)
    measured = [b for b in th.STRAGGLER_BLOCK_ROWS if rows >= th.STRAGGLER_MEASURED_BLOCKS * b]
    if okp.sum() < 3 or not measured:
        # Too few series (or rows) to tell noise from sampling error: as before.
        pool = np.nanmedian(longrun, axis=1)
        return np.fmax(longrun, pool[:, None]), pool
    midp = float(np.median(zp[okp]))
    # Rows are autocorrelated: they are worth (row noise / 8-row noise)^2 as many independent.
    g2 = max(1.0, float(np.nanmedian(longrun[0]) / np.exp(midp)) ** 2)
    se_p = th.STRAGGLER_MAD_EFFICIENCY * np.sqrt(g2 / min(rows, th.STRAGGLER_LEVEL_MAX_ROWS))
    loud_p = okp & (zp - midp > th.STRAGGLER_NOISE_OUTLIER_SE * se_p)
    tau2 = (1.4826 * float(np.median(np.abs(zp[okp & ~loud_p] - midp)))) ** 2
    keep = max(0.0, tau2 - se_p**2) / tau2 if tau2 > 0 else 0.0
    rel = np.exp(np.where(okp, zp - midp, 0.0))
    pooled = th.STRAGGLER_LONGRUN_MIN_FACTOR * float(np.exp(midp))
    for i, b in enumerate(th.STRAGGLER_BLOCK_ROWS):
        z = np.log(longrun[i])
        ok = np.isfinite(z)
        if not ok.any():
            continue
        mid = float(np.median(z[ok]))
        # An extrapolated block is its longest measured block's noise times a constant: the
        # same sampling error.
        se = th.STRAGGLER_MAD_EFFICIENCY * np.sqrt(min(b, measured[-1]) / (1.5 * rows))
        loud = ok & (loud_p | (z - mid > th.STRAGGLER_NOISE_OUTLIER_SE * se))
        shared = ok & ~loud
        if b in measured:
            pooled = max(pooled, float(np.sqrt(np.nanmean(mean_sq[i, shared]))))
        elif i > 0:
            growth = (b / th.STRAGGLER_BLOCK_ROWS[i - 1]) ** th.STRAGGLER_NOISE_GROWTH_EXP
            pooled *= growth
        pooled = max(pooled, float(np.exp(mid)))
        pool[i] = pooled
        own = pool[i] * rel**keep
        out[i] = np.where(loud, np.fmax(longrun[i], pool[i] * rel), own)
        out[i] = np.where(ok, out[i], np.nan)
    return out, pool


def _subsample(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    if n > th.STRAGGLER_LEVEL_MAX_ROWS:
        return x[np.linspace(0, n - 1, th.STRAGGLER_LEVEL_MAX_ROWS).astype(int)]
    return x


def _level(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Each column's level: the median of its rows weighted by their precision (1 / scale^2).

    A job's noise may change several-fold; rows of a noisy spell say little about a rank's
    level, and a plain median over them can sit several quiet-spell noise units away from it
    (the CUSUMs then read the error as a shift: 10-40 false alarms in a 256-rank world whose
    noise went 13% -> 1.6% -> 6%)."""
    n = x.shape[0]
    if n > th.STRAGGLER_LEVEL_MAX_ROWS:
        at = np.linspace(0, n - 1, th.STRAGGLER_LEVEL_MAX_ROWS).astype(int)
        x, scale = x[at], scale[at]
    w = 1.0 / np.fmax(scale, th.STRAGGLER_MIN_NOISE) ** 2
    # Column by column as rows of the transpose: the same sorts and running sums, each over
    # contiguous memory.
    xt = np.ascontiguousarray(x.T)
    order = np.argsort(xt, axis=1)  # NaN last
    xs = np.take_along_axis(xt, order, axis=1)
    ws = np.where(np.isfinite(xs), w[order], 0.0)
    cw = np.cumsum(ws, axis=1)
    half = cw[:, -1:] / 2.0
    i = np.clip(np.sum(cw < half, axis=1, keepdims=True), 0, x.shape[0] - 1)
    out = np.take_along_axis(xs, i, axis=1)[:, 0]
    return np.where(cw[:, -1] > 0, out, np.nan)


def _level_and_noise(x: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-series median (log), and the noise per block length (blocks x series) and of single
    rows, both in units of each row's cross-rank scale (`scale`, one per row), robustly.

    The level and row noise come from an evenly thinned history (medians do not need every
    row); the noise of block means comes from all rows, since thinning stretches a block.
    """
    floor = th.STRAGGLER_MIN_NOISE / max(float(np.nanmedian(scale)), th.STRAGGLER_MIN_NOISE)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: a rank not yet seen
        level = _level(x, scale)
        # Residuals from the rank's own level, divided by their row's cross-rank scale: the
        # job's noise may change for good (a 13% -> 1.6% -> 6% CoV), its ranks' standardised
        # noise much less, so the history's noise stays a fair guide to the rows ahead.
        u = (x - level) / scale[:, None]
        point = 1.4826 * nanmedian(np.abs(_subsample(u)), axis=0)
        longrun, pooled = _pooled_noise(*_longrun_noise(u, point), point, u.shape[0])
        pooled_point = np.nanmedian(point)
    pooled = np.where(np.isfinite(pooled), pooled, floor)[:, None]
    sigma = np.fmax(longrun, floor)
    sigma = np.where(np.isfinite(sigma), sigma, pooled)
    point = np.fmax(np.fmax(point, pooled_point), floor)
    point = np.where(np.isfinite(point), point, floor)
    return level, sigma, point


def _row_spread(dev: np.ndarray) -> np.ndarray:
    """Each row's cross-series spread (MAD, normal-consistent) of deviations from own levels."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return 1.4826 * nanmedian(np.abs(dev - nanmedian(dev, axis=1)[:, None]), axis=1)


def _smooth_rows(m: int) -> int:
    """Rows the cross-rank spread is averaged over: enough cells that its sampling error is
    about STRAGGLER_SCALE_ERROR (a MAD of m normal values has a relative error ~1.17/sqrt(m):
    half its value over ten ranks, 4% over a thousand)."""
    cells = (th.STRAGGLER_MAD_EFFICIENCY / th.STRAGGLER_SCALE_ERROR) ** 2
    return int(np.clip(np.ceil(cells / max(m, 1)), 1, th.STRAGGLER_SCALE_MAX_ROWS))


def _page(
    s0: np.ndarray, start0: np.ndarray, inc: np.ndarray, row0: int
) -> tuple[np.ndarray, np.ndarray]:
    """Page's CUSUM S_t = max(0, S_{t-1} + inc_t) for a block of rows, vectorised over series.

    With D = s0 + cumsum(inc), S = D - min(0, running min of D); the excursion starts after the
    last row where S was 0.
    """
    d = s0 + accumulate_down(np.add, inc)
    low = np.minimum(accumulate_down(np.minimum, d), 0.0)
    s = d - low
    rows = np.arange(row0, row0 + inc.shape[0])[:, None]
    zero_at = np.where(s <= 0.0, rows + 1, -1)
    last_zero = accumulate_down(np.maximum, zero_at)
    start = np.where(last_zero >= 0, last_zero, start0)
    return s, start


def _deviations(
    x: np.ndarray,
    a: int,
    e: int,
    level: np.ndarray,
    point: np.ndarray,
    raw_spread: np.ndarray,
    scale: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows a..e of x as CUSUM input in row-scale units: (clip, clipped standardised deviation
    from the level, burst factor per row, which cells count)."""
    m = x.shape[1]
    clip = th.STRAGGLER_CLIP_SIGMAS * point
    rel = x[a:e]
    ok = np.isfinite(rel) & np.isfinite(level)
    # The shift is measured from the rank's own level, so a rank at 0.98x that slows by 5% is a
    # 5% shift (not 3%); whether the job waits for it (it is now slower than the median rank)
    # is asked apart, when the alarm is raised. Each row is divided by the job's cross-rank
    # scale (smoothed over a few rows), both ways: a quiet spell sharpens, a noisy one blunts.
    dev = np.where(ok, rel - np.nan_to_num(level), 0.0) / scale[a:e, None]
    dev = np.clip(dev, -clip, clip)
    # A single row much wider than the smoothed scale (a burst of contention over a few ranks'
    # rows, or one the smoothing has not caught up with) is shrunk by the excess beyond the
    # sampling error of a spread over m series; with many ranks the scale is the row's own.
    usual = scale[a:e] * (1.0 + th.STRAGGLER_BURST_FACTOR / np.sqrt(m))
    burst = np.fmax(raw_spread[a:e] / usual, 1.0)
    burst = np.where(np.isfinite(burst), burst, 1.0)[:, None]
    return clip, dev / burst, burst, ok


def _slower_than_median(
    csum_x: np.ndarray, csum_n: np.ndarray, start: np.ndarray, a: int, e: int
) -> np.ndarray:
    """Rows a..e: is the mean log ratio over each column's excursion (start..row) above 0?

    A rank that slowed down but is still faster than the median rank (0.85x -> 0.9x) does
    not hold the job up: a change, not a straggler (the trace's labels ask the same, r > 1).
    """
    lo = np.clip(start, 0, csum_x.shape[0] - 1)
    # take_along_axis(csum, lo, axis=0), as one gather from the flat arrays (both are C-ordered
    # (rows + 1, m)): the same cells, without building broadcast index grids twice.
    at = lo * csum_x.shape[1] + np.arange(csum_x.shape[1])
    total = csum_x[a + 1 : e + 1] - csum_x.reshape(-1)[at]
    count = csum_n[a + 1 : e + 1] - csum_n.reshape(-1)[at]
    return total > 0.0 * count


def scan(
    x: np.ndarray,
    *,
    tests: int,
    rows_per_day: float,
    level_ratio: float | None = None,
) -> Scan:
    """CUSUM bank over each column of `x` (log ratio to the median rank), causal by checkpoints.

    Each column's own level and noise come from the rows before the current checkpoint, and are
    frozen while the column is in (or near) alarm, so a straggler does not become its own normal.
    Deviations from the level are divided by their row's cross-column scale (a causal, smoothed
    MAD), so the CUSUMs see noise of the same size whether the job is quiet or noisy now; the
    reference sizes k (log units) are turned into those units at the scale of the checkpoint.
    With `level_ratio`, one more CUSUM tests the absolute level (ratio to the median rank) too.
    """
    n, m = x.shape
    ks = np.array(th.STRAGGLER_CUSUM_K)
    n_k = ks.size + (1 if level_ratio else 0)
    # Brownian approximation: ARL0 ~ exp(2 k h / sigma^2), so h = sigma^2 ln(A) / (2 k) with A
    # the rows one test may run per false alarm inside the budget.
    budget = rows_per_day * th.STRAGGLER_FALSE_ALARM_DAYS * tests * n_k * th.STRAGGLER_FA_SAFETY
    log_a = np.log(max(budget, 10.0))
    above = np.zeros((n, m), dtype=bool)
    start = np.full((n, m), -1, dtype=np.int32)
    s = np.zeros((n_k, m))
    st = np.zeros((n_k, m), dtype=np.int64)
    history = np.zeros((n_k, min(n, th.STRAGGLER_CURRENT_ROWS), m))
    level = np.full(m, np.nan)
    sigma = np.full((len(th.STRAGGLER_BLOCK_ROWS), m), np.nan)
    point = np.full(m, np.nan)
    # Each CUSUM's threshold uses the noise at the block length its shift takes to find.
    block_of = [th.STRAGGLER_BLOCK_ROWS.index(b) for b in th.STRAGGLER_CUSUM_BLOCK]
    h_last = np.zeros((n_k, m))
    frozen = np.zeros(m, dtype=bool)
    # Row scale: each row's cross-column spread of deviations from the levels of its checkpoint
    # (causal), averaged over the last few rows (a spread over ten ranks is itself noisy).
    raw_spread = np.full(n, np.nan)
    width = _smooth_rows(m)
    scale = np.full(n, np.nan)

    def fill_scale(lo: int, hi: int, lev: np.ndarray) -> None:
        raw_spread[lo:hi] = _row_spread(x[lo:hi] - lev)
        w0 = max(0, lo - width + 1)
        seg = raw_spread[w0:hi]
        ok_ = np.isfinite(seg)
        c = np.concatenate(([0.0], np.cumsum(np.where(ok_, seg, 0.0))))
        cn = np.concatenate(([0], np.cumsum(ok_)))
        idx = np.arange(lo - w0, hi - w0) + 1
        lo_idx = np.clip(idx - width, 0, None)
        with np.errstate(all="ignore"):
            mean = (c[idx] - c[lo_idx]) / (cn[idx] - cn[lo_idx])
        prev = scale[lo - 1] if lo > 0 and np.isfinite(scale[lo - 1]) else th.STRAGGLER_MIN_NOISE
        mean = np.where(np.isfinite(mean), mean, prev)
        scale[lo:hi] = np.fmax(mean, th.STRAGGLER_MIN_NOISE)

    noise_rows = 0
    # Running sums of x (a missing cell adds nothing) give the mean of any excursion in O(1):
    # an alarm needs the rank to be slower than the median rank over its excursion.
    seen = np.isfinite(x)
    csum_x = running_sums(np.where(seen, x, 0.0))
    csum_n = running_sums(seen, dtype=float)
    first = min(n, th.STRAGGLER_MIN_ROWS)
    fill_scale(0, first, nanmedian(x[:first], axis=0))
    cuts = np.unique(np.linspace(first, n, th.STRAGGLER_CHECKPOINTS + 1).astype(int))
    ref = scale[max(first - 1, 0)]
    for a, e in itertools.pairwise(cuts):
        keep_old = frozen & np.isfinite(level)
        if a >= th.STRAGGLER_NOISE_GROWTH * noise_rows:
            # The noise estimate changes slowly with more rows: refresh it when they have grown
            # by half (the level is refreshed at every checkpoint).
            new_level, new_sigma, new_point = _level_and_noise(x[:a], scale[:a])
            sigma = np.where(keep_old, sigma, new_sigma)
            point = np.where(keep_old, point, new_point)
            noise_rows = a
        else:
            new_level = _level(x[:a], scale[:a])
        level = np.where(keep_old, level, new_level)
        fill_scale(a, e, level)
        # Rows are read in units of the job's scale, but never in units finer than the
        # precision the levels were learnt at (the history's precision-weighted scale, the one
        # their standard error uses): where a rank's offset grows with the job's noise
        # (contention), a quiet row read in its own units magnified the level's error into
        # alarms on hundreds of ranks at once (51 at one row of a 1,024-rank world). Noisier
        # rows are shrunk in full.
        typical = float(1.0 / np.sqrt(np.mean(scale[:a] ** -2.0)))
        used = np.fmax(scale, typical)
        # The reference sizes k are log shifts: in row-scale units at the scale of the row
        # before the checkpoint (a 5% shift is a big one in a quiet job, a small one in a noisy).
        ref = used[a - 1]
        clip, dev, burst, ok = _deviations(x, a, e, level, point, raw_spread, used)
        # The level is itself estimated from `a` rows: its error would read as a shift, so the
        # slack on k grows by its standard error (the long-run noise in log units over sqrt(a),
        # at the history's precision-weighted scale), here in units of each row's scale.
        level_se = th.STRAGGLER_LEVEL_SE * sigma.max(axis=0) * typical / np.sqrt(max(a, 1))
        slack = level_se[None, :] / used[a:e, None]
        rows = np.arange(a, e)[:, None]
        seg_above = np.zeros((e - a, m), dtype=bool)
        seg_start = np.full((e - a, m), -1, dtype=np.int64)
        incs, hs = [], []
        for j in range(n_k):
            if j < ks.size:
                inc = np.where(ok, dev - ks[j] / ref - slack, 0.0)
                k = (ks[j] + level_se) / ref
            else:
                k = np.full(m, th.STRAGGLER_LEVEL_K / ref)
                rel = x[a:e]
                gap = np.where(np.isfinite(rel), rel, 0.0) - np.log(level_ratio or 1.0)
                gap = gap / used[a:e, None]
                inc = np.where(np.isfinite(rel), np.clip(gap, -clip, clip) / burst, 0.0)
            h = sigma[block_of[j]] ** 2 * log_a / (2.0 * k)
            # A new checkpoint changes the units (scale) and the threshold: the evidence carried
            # over keeps its share of the threshold, or a lower threshold (a quieter scale)
            # would turn the last segment's sums into alarms on many ranks at the same row.
            carry = np.where(h_last[j] > 0, h / np.where(h_last[j] > 0, h_last[j], 1.0), 1.0)
            s[j] *= carry
            history[j] *= carry
            incs.append(inc)
            hs.append(h)
        # The CUSUMs of every k side by side as one wide matrix (k-major, as s and st are laid
        # out): each column's recursion is its own, in a quarter of the row-by-row passes.
        s_all, st_all = _page(s.reshape(-1), st.reshape(-1), np.concatenate(incs, axis=1), a)
        for j in range(n_k):
            sj, stj, h = s_all[:, j * m : (j + 1) * m], st_all[:, j * m : (j + 1) * m], hs[j]
            # Persistence: an excursion shorter than a few rows is a blip, however tall.
            hit = (sj > h) & (rows - stj >= th.STRAGGLER_PERSIST_ROWS - 1)
            if j < ks.size:
                hit &= _slower_than_median(csum_x, csum_n, stj, a, e)
            seg_start = np.where(hit & ~seg_above, stj, seg_start)
            seg_above |= hit
            s[j], st[j], h_last[j] = sj[-1], stj[-1], h
            keep = min(e - a, history.shape[1])
            history[j] = np.concatenate((history[j][keep:], sj[-keep:]), axis=0)
        above[a:e] = seg_above
        start[a:e] = seg_start
        # A column in alarm, or halfway there on its most sensitive CUSUM, keeps its level.
        frozen = seg_above[-1] | (s[0] > th.STRAGGLER_FREEZE_SHARE * h_last[0])
    # The noise in log units at the latest scale (evidence).
    sigma = sigma.max(axis=0) * scale[-1]
    # Current: in alarm and not fallen more than half the threshold below its recent peak (a
    # recovered rank's CUSUM falls by k per row; a persistent one keeps climbing).
    alive = (s > h_last) & (s >= history.max(axis=1) - th.STRAGGLER_CURRENT_DROP * h_last)
    current = above[-1] & alive.any(axis=0)
    # Slow from the start: only the absolute-level test holds it (its own history shows no change).
    by_level = alive[-1] & ~alive[: ks.size].any(axis=0) if level_ratio else np.zeros(m, bool)
    return Scan(above, start, current, level, sigma, by_level, st)


@dataclass
class _Job:
    steps: np.ndarray
    compute: np.ndarray
    x: np.ndarray  # log ratio of each rank's compute to the median rank's, per row
    stride: np.ndarray  # steps each row stands for
    step_time: np.ndarray  # the job's step time per row: the slowest rank's compute (+ comm)
    comm: np.ndarray  # per row, what the job spends beyond the slowest compute (0 if unknown)


def _order(steps: np.ndarray) -> np.ndarray | None:
    """The rows in step order (stable), or None when they are in it already (the usual case:
    no 16 MB copies of a 2,000 x 1,024 window)."""
    if steps.size < 2 or bool(np.all(steps[1:] >= steps[:-1])):
        return None
    return np.argsort(steps, kind="stable")


def _rows(a: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    return a if order is None else a[order]


def _prepare(
    steps: np.ndarray,
    compute: np.ndarray,
    wait: np.ndarray | None,
    total: np.ndarray | None,
) -> _Job:
    order = _order(steps)
    steps, compute = _rows(steps, order), _rows(compute, order)
    compute = np.where(np.isfinite(compute) & (compute > 0), compute, np.nan)
    n, n_ranks = compute.shape
    reporting = np.isfinite(compute).sum(axis=1)
    ok = reporting >= max(2, th.STRAGGLER_MIN_REPORTING * n_ranks)
    log_c = np.log(compute)
    med = np.full(n, np.nan)
    if ok.any():
        med[ok] = nanmedian(log_c[ok], axis=1)
    x = log_c - med[:, None]
    stride = np.diff(steps, prepend=steps[0] - (np.median(np.diff(steps)) if n > 1 else 1.0))
    stride = np.clip(stride, 1.0, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        slowest = np.nanmax(compute, axis=1)
        if total is not None:
            whole = nanmedian(_rows(total, order), axis=1)
        elif wait is not None:
            w = _rows(wait, order)
            whole = nanmedian(compute + np.where(np.isfinite(w), w, 0), axis=1)
        else:
            whole = slowest
    comm = np.clip(np.nan_to_num(whole - slowest), 0.0, None)
    return _Job(steps, compute, x, stride, slowest + comm, comm)


def _onset(y: np.ndarray, lo: int) -> int:
    """Change point of a shift up in y (known zero level before it), searched from row lo."""
    seg = np.where(np.isfinite(y[lo:]), y[lo:], 0.0)
    if seg.size == 0:
        return lo
    tail_sum = np.cumsum(seg[::-1])[::-1]
    count = np.arange(seg.size, 0, -1)
    stat = np.where(tail_sum > 0, tail_sum**2 / count, 0.0)
    return lo + int(np.argmax(stat))


def _cost(job: _Job, ranks: list[int], slowdown: float, onset: int) -> tuple[float, np.ndarray]:
    """Job time lost since `onset` (row) had `ranks` run `slowdown` faster, and the per-row gain."""
    fixed = job.compute.copy()
    fixed[:, ranks] /= 1.0 + slowdown
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        gain = np.nan_to_num(np.nanmax(job.compute, axis=1) - np.nanmax(fixed, axis=1))
    lost = float(np.sum((gain * job.stride)[onset:]))
    return lost, gain


def _straggler(
    job: _Job,
    kind: str,
    ranks: list[int],
    host: str | None,
    series: np.ndarray,
    level: float,
    lo: int,
    evidence: dict[str, Any],
) -> Straggler:
    """One finding: onset (change point of `series` above `level`), slowdown against the median
    rank since then, and the job time lost since then."""
    base = max(level, 0.0) if np.isfinite(level) else 0.0
    onset = _onset(series - base, max(lo, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ratio = float(np.nanmedian(series[onset:]))
    slowdown = max(float(np.expm1(ratio)), 0.0) if np.isfinite(ratio) else 0.0
    cost, _ = _cost(job, ranks, slowdown, onset)
    evidence = {
        **evidence,
        "ratio_to_median": float(np.exp(ratio)) if np.isfinite(ratio) else None,
        "change_vs_own_level": float(np.expm1(ratio - level)) if np.isfinite(level) else None,
        "onset_row": onset,
    }
    steps_affected = int(job.steps[-1] - job.steps[onset] + job.stride[onset])
    onset_step = int(job.steps[onset])
    return Straggler(kind, tuple(ranks), host, onset_step, slowdown, cost, steps_affected, evidence)


def _host_groups(hosts: Sequence[str] | None, n_ranks: int) -> dict[str, list[int]]:
    if hosts is None:
        return {}
    groups: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        groups.setdefault(str(h), []).append(r)
    return {h: rs for h, rs in groups.items() if len(rs) >= 2 and len(rs) < n_ranks}


def _nvidia_scores(job: _Job, rank: int, onset: int) -> dict[str, float]:
    """NVIDIA resiliency-ext style scores for one rank over the rows since onset (evidence)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        recent = nanmedian(job.compute[onset:], axis=0)
        best_own = np.nanmin(job.compute[:, rank])
    return {
        "relative_score": float(np.nanmin(recent) / recent[rank]),
        "individual_score": float(best_own / recent[rank]),
    }


def _last_arrivals(job: _Job, wait: np.ndarray, skip: set[int]) -> list[tuple[int, float, int]]:
    """Ranks last into the collective (least wait) in most recent rows: (rank, share, onset)."""
    n, n_ranks = wait.shape
    if n_ranks < th.STRAGGLER_LAST_MIN_RANKS or n < th.STRAGGLER_LAST_ROWS:
        return []
    w = np.where(np.isfinite(wait), wait, np.inf)
    rows = np.isfinite(wait).sum(axis=1) >= max(2, th.STRAGGLER_MIN_REPORTING * n_ranks)
    last = np.where(rows, np.argmin(w, axis=1), -1)
    recent = last[-th.STRAGGLER_LAST_ROWS :]
    out = []
    for r in np.unique(recent[recent >= 0]):
        share = float(np.mean(recent == r))
        if share < th.STRAGGLER_LAST_SHARE or int(r) in skip:
            continue
        # Onset: where the rank's running share of "last" (from the end back) drops below half.
        is_last = (last == r).astype(float)
        back = np.cumsum(is_last[::-1]) / np.arange(1, n + 1)
        below = np.nonzero(back < th.STRAGGLER_LAST_SHARE)[0]
        onset = (
            n - 1 - int(below[below >= th.STRAGGLER_LAST_ROWS][0]) + 1
            if (below >= th.STRAGGLER_LAST_ROWS).any()
            else 0
        )
        out.append((int(r), share, onset))
    return out


def _host_findings(
    job: _Job, groups: dict[str, list[int]], rank_levels: np.ndarray, per_day: float, tests: int
) -> list[Straggler]:
    """Hosts whose ranks' mean moved, confirmed when most of its ranks moved with it."""
    names = list(groups)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        xh = np.stack([np.nanmean(job.x[:, groups[h]], axis=1) for h in names], axis=1)
    hs = scan(xh, tests=tests, rows_per_day=per_day, level_ratio=th.STRAGGLER_LEVEL_RATIO)
    found = []
    for j in map(int, np.nonzero(hs.current)[0]):
        members = groups[names[j]]
        level = 0.0 if hs.by_level[j] else float(hs.level[j])
        lo = 0 if hs.by_level[j] else int(hs.start_end[:, j].min())
        onset = _onset(xh[:, j] - max(level, 0.0), lo)
        base = np.zeros(len(members)) if hs.by_level[j] else np.fmax(rank_levels[members], 0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            moved = nanmedian(job.x[onset:, members], axis=0) - base
            shift = float(np.nanmedian(xh[onset:, j])) - max(level, 0.0)
        share = float(np.mean(moved >= 0.5 * shift)) if shift > 0 else 0.0
        if share < th.STRAGGLER_HOST_SHARE:
            continue
        ev: dict[str, Any] = {"test": "host_level" if hs.by_level[j] else "host_change_cusum"}
        ev |= {"share_of_ranks_slow": share, "noise_log": float(hs.sigma[j])}
        found.append(_straggler(job, "host", members, names[j], xh[:, j], level, lo, ev))
    return found


def detect_stragglers(
    steps: np.ndarray,
    compute_s: np.ndarray,
    hosts: Sequence[str] | None = None,
    wait_s: np.ndarray | None = None,
    total_s: np.ndarray | None = None,
    *,
    rows_per_day: float | None = None,
) -> StragglerReport:
    """Stragglers at the last row of the history, with the job-level cost and what-if pace.

    `steps` (n,); `compute_s` (n, ranks), NaN where a rank did not report; `hosts[r]` is rank r's
    host; `wait_s` the time each rank spent waiting inside the collective; `total_s` each rank's
    whole step time. Rows need not be sorted. Pass the history since the run began (binned, if
    long): a rank's normal level is learnt from it. `rows_per_day` sizes the false-alarm budget
    (one per job-day over all tests); by default one row per 10 s.
    """
    steps, compute, wait, total = _validate(steps, compute_s, hosts, wait_s, total_s)
    n, n_ranks = compute.shape
    if n < th.STRAGGLER_MIN_ROWS + 2 or n_ranks < 3:
        return EMPTY
    order = _order(steps)
    job = _prepare(steps, compute, wait, total)
    groups = _host_groups(hosts, n_ranks)
    per_day = rows_per_day if rows_per_day is not None else 86400.0 / th.STRAGGLER_DEFAULT_ROW_S
    tests = n_ranks + len(groups)
    rs = scan(job.x, tests=tests, rows_per_day=per_day, level_ratio=th.STRAGGLER_LEVEL_RATIO)
    found = _host_findings(job, groups, rs.level, per_day, tests) if groups else []
    covered = {r for s in found for r in s.ranks}

    def host_of(r: int) -> str | None:
        return None if hosts is None else str(hosts[r])

    for r in map(int, np.nonzero(rs.current)[0]):
        if r in covered:
            continue
        by_level = bool(rs.by_level[r])
        level = 0.0 if by_level else float(rs.level[r])
        lo = 0 if by_level else int(rs.start_end[:, r].min())
        ev: dict[str, Any] = {"test": "level" if by_level else "change_cusum"}
        ev["noise_log"] = float(rs.sigma[r])
        s = _straggler(job, "rank", [r], host_of(r), job.x[:, r], level, lo, ev)
        s.evidence.update(_nvidia_scores(job, r, int(s.evidence["onset_row"])))
        found.append(s)
        covered.add(r)
    if wait is not None:
        for r, share, onset in _last_arrivals(job, _rows(wait, order), covered):
            ev = {"test": "last_arrival", "share_last": share}
            level = float(rs.level[r]) if np.isfinite(rs.level[r]) else 0.0
            found.append(
                _straggler(job, "last_arrival", [r], host_of(r), job.x[:, r], level, onset, ev)
            )
    return _report(job, found)


def _report(job: _Job, found: list[Straggler]) -> StragglerReport:
    tail = slice(-min(len(job.steps), th.STRAGGLER_LEVEL_MAX_ROWS // 4), None)
    fixed = job.compute.copy()
    for s in found:
        fixed[:, list(s.ranks)] /= 1.0 + s.slowdown
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        job_step = float(np.nanmedian(job.step_time[tail]))
        whatif = float(np.nanmedian((np.nanmax(fixed, axis=1) + job.comm)[tail]))
        median_rank = nanmedian(job.compute, axis=1) + job.comm
        median_step = float(np.nanmedian(median_rank[tail]))
    stragglers = sorted(found, key=lambda s: -s.cost_s)
    return StragglerReport(stragglers, median_step, job_step, min(whatif, job_step))
