"""Reads of per-rank step timings (RankTimingChunk): the ranks x steps matrix of a step range,
one rank's history, and the heat map of compute time relative to the median rank.

Storage is one row per rank per batch (see docs/architecture.md, "Per-rank timings"). The two
reads the pages and the detector need are served by the two indexes of that table:
"all ranks over a step range" by (run, max_step), "one rank over the run" by (run, rank,
min_step). Reads are bounded in rows, not only in steps, so a 1,024-rank job cannot make one
page load read millions of rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from django.db.models import Max

from tracker.models import RankTimingChunk, Run
from tracker.series import unpack_steps, unpack_timings

# A window never holds more than this many rank-steps (the detector's matrix: 2M cells of
# three float64 parts is ~48 MB) ...
MAX_WINDOW_CELLS = 2_000_000
# ... nor reads more rows than this (a rank batching 20 s of 1 step/s writes 180 rows an hour).
MAX_WINDOW_ROWS = 60_000


@dataclass(frozen=True)
class RankTimings:
    """Steps x ranks matrices of seconds (NaN: not reported) and each rank's host."""

    steps: np.ndarray  # int64, ascending
    ranks: np.ndarray  # int64, ascending
    hosts: list[str]  # per rank ("" when the rank named none)
    compute: np.ndarray  # (n_steps, n_ranks) float64
    wait: np.ndarray
    total: np.ndarray

    @property
    def empty(self) -> bool:
        return self.steps.size == 0 or self.ranks.size == 0

    def signal(self) -> np.ndarray:
        """The per-rank signal the detector reads: compute time where ranks gave it, else the
        whole step (the automatic mode times the interval between log() calls)."""
        if np.isfinite(self.compute).any():
            return self.compute
        return self.total

    def complete(self, share: float = 0.9) -> RankTimings:
        """Cut the newest steps that too few ranks have reported yet: each rank sends its
        batch on its own clock, so the last ~20 s of a window are always partly empty, and a
        rank that has not sent its newest steps yet would look like it has no recent pace."""
        if self.empty:
            return self
        reported = np.isfinite(self.signal()).sum(axis=1)
        full = np.flatnonzero(reported >= max(1.0, share * self.ranks.size))
        if full.size == 0 or full[-1] == self.steps.size - 1:
            return self
        end = int(full[-1]) + 1
        return RankTimings(
            self.steps[:end],
            self.ranks,
            self.hosts,
            self.compute[:end],
            self.wait[:end],
            self.total[:end],
        )

    @classmethod
    def nothing(cls) -> RankTimings:
        none = np.empty((0, 0))
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), [], none, none, none)


def has_rank_timings(*, run: Run) -> bool:
    return RankTimingChunk.objects.filter(run=run).exists()


def world_of(*, run: Run, through_id: int | None = None) -> int:
    """How many ranks have reported (from the newest rows; the run's world size if larger);
    with `through_id`, of the chunks up to that id (those a rollup has folded)."""
    qs = RankTimingChunk.objects.filter(run=run)
    if through_id is not None:
        qs = qs.filter(id__lte=through_id)
    seen = qs.order_by("-max_step").values_list("rank", flat=True)[: MAX_WINDOW_ROWS // 10]
    return max(len(set(seen)), run.world_size or 0)


def rank_timings_window(
    *,
    run: Run,
    last_steps: int | None = None,
    x0: float | None = None,
    x1: float | None = None,
) -> RankTimings:
    """Every rank's timings over a step range: the last `last_steps` steps reported, or
    [x0, x1]; cut to MAX_WINDOW_CELLS rank-steps and MAX_WINDOW_ROWS rows (newest kept)."""
    qs = RankTimingChunk.objects.filter(run=run)
    if last_steps is not None:
        top = qs.aggregate(top=Max("max_step"))["top"]
        if top is None:
            return RankTimings.nothing()
        world = max(1, world_of(run=run))
        span = max(1, min(last_steps, MAX_WINDOW_CELLS // world))
        x0, x1 = top - span + 1, top
    if x0 is not None:
        qs = qs.filter(max_step__gte=x0)
    if x1 is not None:
        qs = qs.filter(min_step__lte=x1)
    # Ordered by the indexed column alone: the (run, max_step) index returns the rows in this
    # order, where a tiebreaker would make PostgreSQL sort every row of the range (blobs and all)
    # before the LIMIT.
    rows = list(
        qs.order_by("-max_step").values_list("rank", "host", "steps", "compute", "wait", "total")[
            :MAX_WINDOW_ROWS
        ]
    )
    return _matrix(rows[::-1], x0=x0, x1=x1)


def _matrix(rows: list[tuple], *, x0: float | None, x1: float | None) -> RankTimings:
    if not rows:
        return RankTimings.nothing()
    steps = [unpack_steps(bytes(r[2])) for r in rows]
    rank_col = np.concatenate(
        [np.full(s.size, r[0], np.int64) for r, s in zip(rows, steps, strict=True)]
    )
    step_col = np.concatenate(steps)
    parts = [
        np.concatenate([unpack_timings(bytes(r[i])) for r in rows]).astype(np.float64)
        for i in (3, 4, 5)
    ]
    keep = np.ones(step_col.size, dtype=bool)
    if x0 is not None:
        keep &= step_col >= x0
    if x1 is not None:
        keep &= step_col <= x1
    if not keep.any():
        return RankTimings.nothing()
    step_col, rank_col = step_col[keep], rank_col[keep]
    uniq_steps, si = np.unique(step_col, return_inverse=True)
    uniq_ranks, ri = np.unique(rank_col, return_inverse=True)
    shape = (uniq_steps.size, uniq_ranks.size)
    matrices = []
    for part in parts:
        m = np.full(shape, np.nan)
        # Rows are oldest first: a step a rank sent twice (a resume redoing it) keeps the newer.
        m[si, ri] = part[keep]
        matrices.append(m)
    host_of: dict[int, str] = {}
    for r in rows:
        host_of[int(r[0])] = r[1] or host_of.get(int(r[0]), "")
    hosts = [host_of.get(int(r), "") for r in uniq_ranks]
    return RankTimings(uniq_steps, uniq_ranks, hosts, *matrices)


def rank_history(
    *, run: Run, rank: int, limit_rows: int = MAX_WINDOW_ROWS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rank over the run: (steps, compute_s, total_s), served by (run, rank, min_step)."""
    rows = list(
        RankTimingChunk.objects.filter(run=run, rank=rank)
        .order_by("-min_step")
        .values_list("steps", "compute", "total")[:limit_rows]
    )[::-1]
    if not rows:
        empty = np.empty(0)
        return np.empty(0, np.int64), empty, empty
    steps = np.concatenate([unpack_steps(bytes(r[0])) for r in rows])
    compute = np.concatenate([unpack_timings(bytes(r[1])) for r in rows]).astype(np.float64)
    total = np.concatenate([unpack_timings(bytes(r[2])) for r in rows]).astype(np.float64)
    order = np.argsort(steps, kind="stable")
    return steps[order], compute[order], total[order]


@dataclass(frozen=True)
class Heatmap:
    """Compute time relative to the median rank, per (time bucket, row). A row is a host (the
    slowest of its ranks) or, drilled down, one rank of a host."""

    x: np.ndarray  # bucket middle step
    rows: list[str]  # "node-3" or "rank 17"
    values: np.ndarray  # (n_rows, n_buckets) ratio to the bucket's median rank; NaN: no data
    slowest: list[tuple[int, str, float]]  # (rank, host, ratio over the range), slowest first


def heatmap(
    timings: RankTimings, *, buckets: int = 120, host: str | None = None, by_host: bool = True
) -> Heatmap:
    """Aggregate a window for the run page: time into `buckets`, ranks into hosts (or, with
    `host`, that host's ranks; with `by_host=False`, every rank). Thousands of ranks stay
    readable as tens of hosts."""
    if timings.empty:
        return Heatmap(np.empty(0), [], np.empty((0, 0)), [])
    signal = timings.signal()
    with np.errstate(invalid="ignore", divide="ignore"):
        median = np.nanmedian(np.where(np.isfinite(signal), signal, np.nan), axis=1)
        ratio = signal / median[:, None]
    n = min(buckets, timings.steps.size)
    edges = np.linspace(0, timings.steps.size, n + 1).astype(int)
    cells = np.full((timings.ranks.size, n), np.nan)
    for b in range(n):
        block = ratio[edges[b] : edges[b + 1]]
        if block.size and np.isfinite(block).any():
            with np.errstate(invalid="ignore"):
                cells[:, b] = np.nanmean(np.where(np.isfinite(block), block, np.nan), axis=0)
    mids = np.array(
        [timings.steps[(edges[b] + max(edges[b + 1] - 1, edges[b])) // 2] for b in range(n)],
        dtype=float,
    )
    with np.errstate(invalid="ignore"):
        overall = np.nanmean(np.where(np.isfinite(ratio), ratio, np.nan), axis=0)
    order = np.argsort(-np.nan_to_num(overall, nan=-np.inf))
    slowest = [
        (int(timings.ranks[i]), timings.hosts[i], float(overall[i]))
        for i in order[:10]
        if np.isfinite(overall[i])
    ]
    hosts = [h or "(no host)" for h in timings.hosts]
    if not by_host:
        labels = [f"rank {int(r)}" for r in timings.ranks]
        return Heatmap(mids, labels, cells, slowest)
    if host is not None:
        picked = [i for i, h in enumerate(hosts) if h == host]
        labels = [f"rank {int(timings.ranks[i])}" for i in picked]
        return Heatmap(mids, labels, cells[picked], slowest)
    names = sorted(set(hosts))
    values = np.full((len(names), n), np.nan)
    for row, name in enumerate(names):
        members = cells[[i for i, h in enumerate(hosts) if h == name]]
        if np.isfinite(members).any():
            with np.errstate(invalid="ignore"):
                # The slowest rank of the host: one straggler must not average away.
                values[row] = np.nanmax(np.where(np.isfinite(members), members, -np.inf), axis=0)
    values[np.isinf(values)] = np.nan
    return Heatmap(mids, names, values, slowest)
