"""Reads of per-rank step timings (RankTimingChunk): the ranks x steps matrix of a step range,
one rank's history, and the heat map of compute time relative to the median rank; and the
per-window rollup the straggler forecast reads its window from (`rank_timings_recent`, below).

Storage is one row per rank per batch (see docs/architecture.md, "Per-rank timings"). The two
reads the pages and the detector need are served by the two indexes of that table:
"all ranks over a step range" by (run, max_step), "one rank over the run" by (run, rank,
min_step). Reads are bounded in rows, not only in steps, so a 1,024-rank job cannot make one
page load read millions of rows.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from django.db import connection, transaction
from django.db.models import Max

from tracker.models import RankTimingBlock, RankTimingChunk, RankTimingRollup, Run
from tracker.series import pack_steps, unpack_steps, unpack_timings

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


# The per-window rollup of per-rank step timings: a run's recent steps x ranks matrices kept
# compacted in blocks of BLOCK_STEPS steps (`RankTimingBlock`), so the straggler forecast of a
# 1,024-rank job reads ~30 rows instead of 60,000 chunks.
#
# Blocks are written from new chunks only: each forecast first folds the chunks that arrived
# since the last fold (`rank_rollup_fold`), then cuts its window from the blocks
# (`rank_timings_recent`). The window equals the raw read's (`rank_timings_window`) on the same
# chunks, cell for cell, with one difference: the raw read also stops at 60,000 chunk rows (a
# bound on its cost, ~1,180 steps of a 1,024-rank job), the rollup serves the whole window
# bounded in cells (~1,950 steps).
#
# Exactness:
# - A step a rank sent twice (a resume re-sending steps) keeps the value of the chunk later in
#   (max_step, id) order, as the raw read, which reads rows ordered by max_step (ties in insertion
#   order), keeps the later row's. Each cell remembers its chunk's max_step (`owner`) and a later
#   chunk replaces it when its max_step is at least as high: chunks are folded in id order.
# - A rank's host is the last non-empty host among the window's chunks, kept per block.
# - Concurrent ingest: a chunk's id is drawn before its INSERT commits, so "every chunk with
#   id <= N" is only known folded once no insert that drew an id <= N is still in flight. On
#   PostgreSQL a chunk draws its id under a shared advisory lock of its run, held to its commit
#   (a BEFORE INSERT trigger, migration 0015: no extra statement on the ingest path); the fold
#   takes that lock exclusively for the one query that reads the newest id, so it waits for the
#   inserts in flight and no later one can draw a smaller id. SQLite runs one writer at a time.
# - No path deletes single chunks: the run's purge (tracker.bulk.runs_purge) cascades to its
#   chunks, blocks and rollup row alike. A future path that deletes chunks must call
#   `rank_rollup_reset`.

BLOCK_STEPS = 64
# The longest window the rollup serves (forecasting's STRAGGLER_WINDOW_STEPS, 2,000, fits):
# blocks wholly older than this many steps before the newest are deleted, chunks that old are
# not folded, and a longer window is read raw.
ROLLUP_STEPS = 2_000
# The advisory lock's first key (a PostgreSQL two-key lock: this, then the run's id modulo
# 2^31); the chunk table's trigger takes it with the same keys (migration 0015).
_LOCK_CLASS = 0x524B5452
_NONE = np.iinfo(np.int64).min  # owner of a cell no chunk wrote
_TIMING = np.dtype("<f4")
_PARTS = ("compute", "wait", "total")


def _lock_key(run_id: int) -> int:
    # The second key is an int4: runs whose ids collide modulo 2^31 only wait for each other.
    return int(run_id) % 2**31


def _horizon(run: Run, after: int) -> tuple[int | None, int | None]:
    """(newest chunk id, newest max_step) of the run's chunks with id > `after`, once every
    insert of this run in flight has committed or rolled back."""
    postgres = connection.vendor == "postgresql"
    key = [_LOCK_CLASS, _lock_key(run.pk)]
    with connection.cursor() as cursor:
        if postgres:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", key)
        try:
            # In a savepoint: a failed query must leave the transaction able to unlock (a
            # session lock outlives it, and every insert of this run would wait on it).
            with transaction.atomic():
                got = RankTimingChunk.objects.filter(run=run, id__gt=after).aggregate(
                    last=Max("id"), top=Max("max_step")
                )
        finally:
            if postgres:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", key)
    return got["last"], got["top"]


def rank_rollup_reset(*, run: Run) -> None:
    """Forget the rollup: the next fold rebuilds it from the chunks."""
    RankTimingBlock.objects.filter(run=run).delete()
    RankTimingRollup.objects.filter(run=run).delete()


@transaction.atomic
def rank_rollup_fold(*, run: Run) -> RankTimingRollup:
    """Fold the chunks that arrived since the last fold into the run's blocks; returns the
    rollup's state. The state row is locked: a second fold of the run waits for this one."""
    RankTimingRollup.objects.get_or_create(run=run)
    state = RankTimingRollup.objects.select_for_update().get(run=run)
    last, top = _horizon(run, state.through_id)
    if last is None or top is None:
        return state
    top = max(top, state.top_step) if state.top_step is not None else top
    floor = top - ROLLUP_STEPS + 1
    if state.floor_step is not None:
        floor = max(floor, state.floor_step)
    rows = list(
        RankTimingChunk.objects.filter(
            run=run, id__gt=state.through_id, id__lte=last, max_step__gte=floor
        )
        .order_by("id")
        .values_list("rank", "host", "max_step", "steps", "compute", "wait", "total")
    )
    if rows:
        _fold(run, rows, floor)
    RankTimingBlock.objects.filter(run=run, lo__lte=floor - BLOCK_STEPS).delete()
    state.through_id, state.top_step, state.floor_step = last, top, floor
    state.save(update_fields=["through_id", "top_step", "floor_step"])
    return state


class _Block:
    """One block's arrays, unpacked for a fold."""

    def __init__(self, run: Run, lo: int, row: RankTimingBlock | None) -> None:
        self.run, self.lo, self.row = run, lo, row
        if row is None:
            self.steps = np.empty(0, np.int64)
            self.ranks = np.empty(0, np.int64)
            self.hosts: list[str] = []
            self.host_steps = np.empty(0, np.int64)
            self.parts = [np.empty((0, 0), _TIMING) for _ in range(3)]
            self.owner = np.empty((0, 0), np.int64)
            return
        self.steps = unpack_steps(bytes(row.steps))
        self.ranks = unpack_steps(bytes(row.ranks))
        shape = (self.steps.size, self.ranks.size)
        self.hosts = list(row.hosts)
        self.host_steps = unpack_steps(bytes(row.host_steps))
        self.parts = [_unpack_part(bytes(getattr(row, name)), shape) for name in _PARTS]
        self.owner = np.frombuffer(bytes(row.owner), dtype=np.int64).reshape(shape)

    def merge(
        self,
        step: np.ndarray,
        rank: np.ndarray,
        owner: np.ndarray,
        parts: Sequence[np.ndarray],
        host_rank: np.ndarray,
        host_name: list[str],
        host_step: np.ndarray,
    ) -> None:
        """Fold cells (in precedence order: later wins) and host records into the block."""
        steps = np.union1d(self.steps, step)
        ranks = np.union1d(self.ranks, rank)
        shape = (steps.size, ranks.size)
        si_old = np.searchsorted(steps, self.steps)
        ri_old = np.searchsorted(ranks, self.ranks)
        merged_owner = np.full(shape, _NONE, np.int64)
        merged_owner[np.ix_(si_old, ri_old)] = self.owner
        merged = []
        for old in self.parts:
            m = np.full(shape, np.nan, _TIMING)
            m[np.ix_(si_old, ri_old)] = old
            merged.append(m)
        # The last cell of each (step, rank) in precedence order, then against the stored one.
        flat = np.searchsorted(steps, step) * ranks.size + np.searchsorted(ranks, rank)
        _, last_rev = np.unique(flat[::-1], return_index=True)
        pick = flat.size - 1 - last_rev
        flat, owner = flat[pick], owner[pick]
        wins = owner >= merged_owner.reshape(-1)[flat]
        flat, pick, owner = flat[wins], pick[wins], owner[wins]
        merged_owner.reshape(-1)[flat] = owner
        for m, new in zip(merged, parts, strict=True):
            m.reshape(-1)[flat] = new[pick]
        hosts = [""] * ranks.size
        host_steps = np.full(ranks.size, _NONE, np.int64)
        hosts_old = np.searchsorted(ranks, self.ranks)
        for i, name, at in zip(hosts_old, self.hosts, self.host_steps, strict=True):
            hosts[int(i)], host_steps[int(i)] = name, at
        for r, name, at in zip(
            np.searchsorted(ranks, host_rank), host_name, host_step, strict=True
        ):
            if at >= host_steps[r]:
                hosts[int(r)], host_steps[int(r)] = name, at
        self.steps, self.ranks, self.owner, self.parts = steps, ranks, merged_owner, merged
        self.hosts, self.host_steps = hosts, host_steps

    def save(self) -> None:
        fields = {
            "steps": pack_steps(self.steps),
            "ranks": pack_steps(self.ranks),
            "hosts": self.hosts,
            "host_steps": pack_steps(self.host_steps),
            **{name: _pack_part(part) for name, part in zip(_PARTS, self.parts, strict=True)},
            "present": np.packbits(self.owner != _NONE, axis=None).tobytes(),
            "owner": self.owner.tobytes(),
        }
        if self.row is None:
            RankTimingBlock.objects.create(run=self.run, lo=self.lo, **fields)
        else:
            RankTimingBlock.objects.filter(pk=self.row.pk).update(**fields)


def _pack_part(part: np.ndarray) -> bytes:
    # A part no rank gave in the whole block (total time, when ranks give compute and wait) is
    # stored empty: a third fewer bytes to send and decode for each window read.
    return part.tobytes() if not np.isnan(part).all() else b""


def _unpack_part(blob: bytes, shape: tuple[int, int]) -> np.ndarray:
    if not blob:
        return np.full(shape, np.nan, _TIMING)
    return unpack_timings(blob).reshape(shape)


def _fold(run: Run, rows: list[tuple], floor: int) -> None:
    """Fold chunk rows (in id order, none with max_step below `floor`) into the blocks."""
    steps = [unpack_steps(bytes(r[3])) for r in rows]
    sizes = np.array([s.size for s in steps])
    step = np.concatenate(steps)
    rank = np.repeat(np.array([r[0] for r in rows], np.int64), sizes)
    top = np.array([r[2] for r in rows], np.int64)
    owner = np.repeat(top, sizes)
    seq = np.repeat(np.arange(len(rows)), sizes)
    parts = [np.concatenate([unpack_timings(bytes(r[i])) for r in rows]) for i in (4, 5, 6)]
    # Precedence: (max_step, id); rows are in id order, so (owner, seq) sorts cells by it.
    keep = step >= floor
    order = np.lexsort((seq[keep], owner[keep]))
    step, rank, owner = step[keep][order], rank[keep][order], owner[keep][order]
    parts = [p[keep][order] for p in parts]
    lo = (step // BLOCK_STEPS) * BLOCK_STEPS
    # Host records: a chunk's host goes to the block of its max_step, in the same order.
    named = [i for i, r in enumerate(rows) if r[1]]
    h_order = sorted(named, key=lambda i: (rows[i][2], i))
    h_rank = np.array([rows[i][0] for i in h_order], np.int64)
    h_name = [str(rows[i][1]) for i in h_order]
    h_step = np.array([rows[i][2] for i in h_order], np.int64)
    h_lo = (h_step // BLOCK_STEPS) * BLOCK_STEPS
    touched = np.unique(lo)
    existing = {b.lo: b for b in RankTimingBlock.objects.filter(run=run, lo__in=list(touched))}
    for block_lo in map(int, touched):
        block = _Block(run, block_lo, existing.get(block_lo))
        cells = lo == block_lo
        h = h_lo == block_lo
        block.merge(
            step[cells],
            rank[cells],
            owner[cells],
            [p[cells] for p in parts],
            h_rank[h],
            [n for n, m in zip(h_name, h, strict=True) if m],
            h_step[h],
        )
        block.save()


def rank_timings_recent(*, run: Run, last_steps: int) -> RankTimings:
    """Every rank's timings over the last `last_steps` steps reported, from the rollup (folded
    first): `rank_timings_window(run=run, last_steps=last_steps)` without its row bound.

    A run whose ranks send no timings (most) costs one indexed query and gets no rollup row:
    every forecast of every run asks."""
    if not has_rank_timings(run=run):
        return RankTimings.nothing()
    state = rank_rollup_fold(run=run)
    top = state.top_step
    if top is None:
        return RankTimings.nothing()
    world = max(1, world_of(run=run, through_id=state.through_id))
    span = max(1, min(last_steps, MAX_WINDOW_CELLS // world))
    x0 = top - span + 1
    if state.floor_step is None or x0 < state.floor_step:
        return rank_timings_window(run=run, last_steps=last_steps)
    return _window(_block_rows(run, lo_above=x0 - BLOCK_STEPS, lo_to=top), x0=x0, x1=top)


_WINDOW_COLUMNS = ("steps", "ranks", "hosts", "host_steps", "compute", "wait", "total", "present")


def _block_rows(run: Run, *, lo_above: int, lo_to: int) -> list[tuple]:
    """The window's blocks, in step order. On PostgreSQL by a binary COPY: bytea columns come
    as the bytes themselves, where a query's text results send them hex-encoded (twice the
    bytes, encoded by the server and decoded here: ~2/3 of a 1,024-rank window read's CPU)."""
    if connection.vendor != "postgresql":
        return list(
            RankTimingBlock.objects.filter(run=run, lo__gt=lo_above, lo__lte=lo_to)
            .order_by("lo")
            .values_list(*_WINDOW_COLUMNS)
        )
    columns = ", ".join("hosts::text" if c == "hosts" else c for c in _WINDOW_COLUMNS)
    # COPY takes no parameters: the three values are integers formatted here.
    sql = (
        f"COPY (SELECT {columns} FROM {RankTimingBlock._meta.db_table}"  # noqa: S608
        f" WHERE run_id = {int(run.pk)} AND lo > {int(lo_above)} AND lo <= {int(lo_to)}"
        " ORDER BY lo) TO STDOUT (FORMAT binary)"
    )
    out = io.BytesIO()
    with connection.cursor() as cursor:
        cursor.copy_expert(sql, out)
    hosts = _WINDOW_COLUMNS.index("hosts")
    return [
        tuple(json.loads(bytes(v)) if i == hosts else v for i, v in enumerate(row))
        for row in _copy_rows(out.getbuffer())
    ]


def _copy_rows(data: memoryview) -> list[tuple[memoryview, ...]]:
    """The tuples of PostgreSQL's binary COPY format (each field a view of its bytes)."""
    pos = len(b"PGCOPY\n\xff\r\n\x00") + 4  # signature, flags
    (extension,) = struct.unpack_from(">i", data, pos)
    pos += 4 + extension
    rows: list[tuple[memoryview, ...]] = []
    while True:
        (count,) = struct.unpack_from(">h", data, pos)
        pos += 2
        if count < 0:  # the trailer
            return rows
        fields = []
        for _ in range(count):
            (size,) = struct.unpack_from(">i", data, pos)
            pos += 4
            fields.append(data[pos : pos + max(size, 0)])
            pos += max(size, 0)
        rows.append(tuple(fields))


def _window(rows: list[tuple], *, x0: int, x1: int) -> RankTimings:
    if not rows:
        return RankTimings.nothing()
    steps = [unpack_steps(r[0]) for r in rows]
    ranks = [unpack_steps(r[1]) for r in rows]
    all_steps = np.concatenate(steps)
    all_ranks = np.unique(np.concatenate(ranks))
    shape = (all_steps.size, all_ranks.size)
    out = [np.full(shape, np.nan) for _ in range(3)]
    present = np.zeros(shape, dtype=bool)
    host_arr = np.full(all_ranks.size, "", dtype=object)
    at = 0
    for r, s, k in zip(rows, steps, ranks, strict=True):
        block = slice(at, at + s.size)
        at += s.size
        same = k.size == all_ranks.size
        cols = slice(None) if same else np.searchsorted(all_ranks, k)
        for m, i in zip(out, (4, 5, 6), strict=True):
            if len(r[i]):  # empty: NaN throughout, as `m` starts
                m[block, cols] = unpack_timings(r[i]).reshape(s.size, k.size)
        bits = np.unpackbits(np.frombuffer(r[7], np.uint8), count=s.size * k.size)
        present[block, cols] = bits.reshape(s.size, k.size).astype(bool)
        # A host counts when its chunk is in the window (max_step >= x0); blocks are in step
        # order, so a later block's host replaces an earlier one's.
        host_steps = unpack_steps(r[3])
        named = host_steps >= x0
        if named.any():
            idx = np.searchsorted(all_ranks, k[named])
            host_arr[idx] = np.asarray(r[2], dtype=object)[named]
    # Steps ascend: the window is a slice (only the first block reaches below x0).
    rows_in = slice(
        int(np.searchsorted(all_steps, x0, "left")), int(np.searchsorted(all_steps, x1, "right"))
    )
    seen = present[rows_in].any(axis=0)
    if not seen.any():
        return RankTimings.nothing()
    parts = [m[rows_in] if seen.all() else m[rows_in][:, seen] for m in out]
    return RankTimings(
        all_steps[rows_in], all_ranks[seen], [str(h) for h in host_arr[seen]], *parts
    )
