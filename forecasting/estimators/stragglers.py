"""Which rank (or host) does a synchronous job wait for, since when, and what does it cost?

In synchronous data parallelism every rank waits in the collective for the slowest one, so the
total step time is the same on all ranks and says nothing about who is slow. The signal is each
rank's own compute time (or its wait inside the collective: the straggler waits least).

Input is a steps x ranks matrix; everything is vectorised over ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forecasting.estimators import thresholds as th
from forecasting.estimators.jsonable import plain


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
    return steps, compute, extra[0], extra[1]


def detect_stragglers(
    steps: np.ndarray,
    compute_s: np.ndarray,
    hosts: Sequence[str] | None = None,
    wait_s: np.ndarray | None = None,
    total_s: np.ndarray | None = None,
) -> StragglerReport:
    """Stragglers at the last step of the history, with the job-level cost and what-if pace.

    `steps` (n,); `compute_s` (n, ranks), NaN where a rank did not report; `hosts[r]` is rank r's
    host; `wait_s` the time each rank spent waiting inside the collective; `total_s` each rank's
    whole step time. Rows need not be sorted.
    """
    steps, compute, wait, total = _validate(steps, compute_s, hosts, wait_s, total_s)
    order = np.argsort(steps, kind="stable")
    steps, compute = steps[order], compute[order]
    wait = None if wait is None else wait[order]
    total = None if total is None else total[order]
    compute = np.where(compute > 0, compute, np.nan)
    n, n_ranks = compute.shape
    if n < th.STRAGGLER_REF_MIN + th.STRAGGLER_LEVEL_STEPS or n_ranks < 3:
        return EMPTY
    reporting = np.isfinite(compute).sum(axis=1)
    ok = reporting >= max(2, th.STRAGGLER_MIN_REPORTING * n_ranks)
    log_c = np.log(compute)
    med = np.full(n, np.nan)
    med[ok] = np.nanmedian(log_c[ok], axis=1)
    x = log_c - med[:, None]  # log ratio to the median rank
    ref_n = int(np.clip(n * th.STRAGGLER_REF_FRACTION, th.STRAGGLER_REF_MIN, th.STRAGGLER_REF_MAX))
    own = np.nanmedian(x[:ref_n], axis=0)
    recent = np.nanmedian(x[-th.STRAGGLER_LEVEL_STEPS :], axis=0)
    found: list[Straggler] = []
    step_time = np.nanmax(compute, axis=1)
    for r in range(n_ranks):
        level = recent[r]
        change = level - own[r]
        if np.isfinite(level) and level >= np.log(th.STRAGGLER_LEVEL_RATIO):
            slow, onset = float(np.exp(level) - 1), int(steps[0])
        elif np.isfinite(change) and change >= np.log(1.05):
            slow, onset = float(np.exp(change) - 1), int(steps[-th.STRAGGLER_LEVEL_STEPS])
        else:
            continue
        after = steps >= onset
        others = np.delete(compute, r, axis=1)
        fixed = np.fmax(np.nanmax(others, axis=1), compute[:, r] / (1 + slow))
        cost = float(np.nansum((step_time - fixed)[after]))
        host = None if hosts is None else str(hosts[r])
        found.append(
            Straggler("rank", (r,), host, onset, slow, cost, int(after.sum()), {"level": level})
        )
    tail = slice(-th.STRAGGLER_LEVEL_STEPS, None)
    job = float(np.nanmedian(step_time[tail]))
    fixed_all = compute.copy()
    for s in found:
        fixed_all[:, list(s.ranks)] /= 1 + s.slowdown
    whatif = float(np.nanmedian(np.nanmax(fixed_all, axis=1)[tail]))
    median_step = float(np.nanmedian(np.exp(med[tail])))
    return StragglerReport(found, median_step, job, whatif)
