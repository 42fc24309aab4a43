"""Detectors as alarm matrices (rows x ranks, causal), and scoring of alarms against truth."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from forecasting.estimators import thresholds as th
from forecasting.estimators.straggler_detect import scan

# NVIDIA resiliency-ext: scores over a report interval of several steps; a rank is a straggler
# when its score falls below the threshold (0.7 by default for both scores in its PTL callback).
NVIDIA_WINDOW_ROWS = 10
NVIDIA_THRESHOLD = 0.7

Detector = Callable[[np.ndarray, float, dict[str, list[int]]], tuple[np.ndarray, np.ndarray]]


def log_ratio(compute: np.ndarray) -> np.ndarray:
    logc = np.log(np.where(compute > 0, compute, np.nan))
    return logc - np.nanmedian(logc, axis=1, keepdims=True)


def host_series(x: np.ndarray, hosts: dict[str, list[int]]) -> np.ndarray:
    return np.stack([np.nanmean(x[:, rs], axis=1) for rs in hosts.values()], axis=1)


def runcast(
    compute: np.ndarray, per_day: float, hosts: dict[str, list[int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Rank alarms and host alarms as the estimator's scan raises them, row by row."""
    x = log_ratio(compute)
    tests = x.shape[1] + len(hosts)
    ranks = scan(x, tests=tests, rows_per_day=per_day, level_ratio=th.STRAGGLER_LEVEL_RATIO)
    if not hosts:
        return ranks.above, np.zeros((x.shape[0], 0), dtype=bool)
    xh = host_series(x, hosts)
    host = scan(xh, tests=tests, rows_per_day=per_day, level_ratio=th.STRAGGLER_LEVEL_RATIO)
    return ranks.above, host.above


def _oracle_noise(x_clean: np.ndarray) -> tuple[float, float]:
    """The series' level and long-run noise, known from its whole clean series: the median, and
    the spread of its 64-row means x sqrt(64) (shorter blocks when the series is short; the
    rows are autocorrelated). NaN noise when the series is too short for any block."""
    x = x_clean[np.isfinite(x_clean)]
    b = next((b for b in (64, 32, 16, 8) if x.size >= 3 * b), 0)
    if not b:
        return float("nan"), float("nan")
    level = float(np.median(x))
    csum = np.concatenate(([0.0], np.cumsum(x - level)))
    means = ((csum[b:] - csum[:-b]) / b)[:: max(1, b // 4)]
    sigma = 1.4826 * float(np.median(np.abs(means - np.median(means)))) * np.sqrt(b)
    return level, sigma


def rows_needed(x_clean: np.ndarray, factor: float, per_day: float, tests: int) -> float:
    """Rows after the onset an oracle needs to find a slowdown by `factor` in this series.

    The oracle knows the series' level and its long-run noise sigma (`_oracle_noise`) and runs
    the optimal CUSUM (k = delta / 2) at the same false-alarm budget as the detectors (one per
    job-day over `tests` series): its mean delay is 2 sigma^2 ln(A) / delta^2 rows (Lorden;
    Siegmund). A trial with fewer rows left than that cannot be found by any detector inside
    the budget except by luck; recall over the trials with enough rows says how much of what is
    findable a detector finds. The oracle needs no safety margin, no bank of k and no estimated
    level, so it is optimistic.
    """
    _, sigma = _oracle_noise(x_clean)
    if not np.isfinite(sigma) or factor <= 1.0:
        return float("inf")
    delta = float(np.log(factor))
    return 2.0 * sigma**2 * float(np.log(max(per_day * tests, 10.0))) / delta**2


def oracle_delay(
    x: np.ndarray, x_clean: np.ndarray, factor: float, per_day: float, tests: int, onset: int
) -> float | None:
    """Rows from the onset to the oracle's alarm on series `x` (None: not found), run rather
    than predicted: the CUSUM of `rows_needed` (k = delta / 2, h = sigma^2 ln(A) / (2k), the
    level and sigma known from the clean series), with the mean delay replaced by the actual
    path. Its recall on the findable trials is what a detector that knew the rank's level and
    noise would get: the gap to it is what estimating them costs."""
    level, sigma = _oracle_noise(x_clean)
    if not np.isfinite(sigma) or factor <= 1.0:
        return None
    k = float(np.log(factor)) / 2.0
    h = sigma**2 * float(np.log(max(per_day * tests, 10.0))) / (2.0 * k)
    d = np.cumsum(np.where(np.isfinite(x), x - level - k, 0.0))
    s = d - np.minimum(np.minimum.accumulate(d), 0.0)
    return first_after(s > h, onset)


def _windows(compute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean compute per rank over consecutive report intervals, and each interval's last row."""
    w = NVIDIA_WINDOW_ROWS
    n = compute.shape[0] // w
    means = np.nanmean(compute[: n * w].reshape(n, w, -1), axis=1)
    return means, np.arange(1, n + 1) * w - 1


def _spread(flags: np.ndarray, ends: np.ndarray, rows: int) -> np.ndarray:
    """Per-interval flags as a rows x ranks alarm matrix (raised at each interval's last row)."""
    out = np.zeros((rows, flags.shape[1]), dtype=bool)
    for i, end in enumerate(ends):
        stop = ends[i + 1] if i + 1 < len(ends) else rows
        out[end:stop] = flags[i]
    return out


def _no_hosts(rows: int) -> np.ndarray:
    return np.zeros((rows, 0), dtype=bool)


def nvidia_relative(
    compute: np.ndarray, per_day: float, hosts: dict[str, list[int]], threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """Relative score: the fastest rank's time / this rank's, per report interval."""
    means, ends = _windows(compute)
    score = np.nanmin(means, axis=1, keepdims=True) / means
    return _spread(score < threshold, ends, compute.shape[0]), _no_hosts(compute.shape[0])


def nvidia_individual(
    compute: np.ndarray, per_day: float, hosts: dict[str, list[int]], threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """Individual score: the rank's own best interval so far / its current interval."""
    means, ends = _windows(compute)
    score = np.fmin.accumulate(means, axis=0) / means
    return _spread(score < threshold, ends, compute.shape[0]), _no_hosts(compute.shape[0])


def edges(above: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns where an alarm is raised (off at the row before)."""
    prev = np.vstack([np.zeros((1, above.shape[1]), dtype=bool), above[:-1]])
    rows, cols = np.nonzero(above & ~prev)
    return rows, cols


@dataclass
class Truth:
    """What an injected or labelled run contains, in rows."""

    rank: int | None = None  # injected rank
    host: str | None = None  # injected host
    onset: int = 0
    eligible: bool = True  # the slowed rank ends up slower than the median rank
    excused: list[tuple[int, int, int]] = field(default_factory=list)  # (rank, lo, hi) windows


@dataclass
class Outcome:
    hit: bool | None  # None: nothing was injected (or not eligible)
    delay: float | None
    false_alarms: int


def first_after(alarm: np.ndarray, onset: int) -> int | None:
    rows = np.nonzero(alarm[onset:])[0]
    return int(rows[0]) if rows.size else None


def score(
    ranks_above: np.ndarray,
    hosts_above: np.ndarray,
    hosts: dict[str, list[int]],
    truth: Truth,
) -> Outcome:
    n = ranks_above.shape[0]
    excused = np.zeros_like(ranks_above)
    for r, lo, hi in truth.excused:
        excused[max(0, lo) : min(n, hi + 1), r] = True
    names = list(hosts)
    members = hosts.get(truth.host, []) if truth.host else []
    if truth.rank is not None:
        excused[truth.onset :, truth.rank] = True
    if members:
        excused[truth.onset :, members] = True
    rows, cols = edges(ranks_above)
    fa = int(np.sum(~excused[rows, cols]))
    if hosts_above.shape[1]:
        h_rows, h_cols = edges(hosts_above)
        for row, col in zip(h_rows, h_cols, strict=True):
            group = hosts[names[col]]
            # A host's mean also moves when one of its ranks is slow: not a false host alarm.
            if not excused[row, group].any() and not (
                names[col] == truth.host and row >= truth.onset
            ):
                fa += 1
    if truth.rank is None and truth.host is None:
        return Outcome(None, None, fa)
    if truth.rank is not None:
        delay = first_after(ranks_above[:, truth.rank], truth.onset)
    else:
        col = names.index(truth.host) if truth.host in names[: hosts_above.shape[1]] else None
        by_host = first_after(hosts_above[:, col], truth.onset) if col is not None else None
        share = ranks_above[:, members].mean(axis=1) >= 0.5
        by_ranks = first_after(share, truth.onset)
        found = [d for d in (by_host, by_ranks) if d is not None]
        delay = min(found) if found else None
    if not truth.eligible:
        return Outcome(None, None, fa)
    return Outcome(delay is not None, None if delay is None else float(delay), fa)
