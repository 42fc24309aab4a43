"""Compaction: a run's old one-batch metric chunks merged into chunks of a few thousand points.

At the client's default cadence (a batch a second) every chunk holds one point of one key:
~290 bytes of row, rollup and index entries for 24 bytes of data (docs/benchmarks.md#growth).
Once retention has deleted a chunk's batch row (tracker.retention; the chunk's `batch` is null)
nothing reads it as a batch any more: liveness reads the chunks of the batches it still has,
dedupe reads batch rows and the segments' seq floors. Such chunks are merged here, per series
(run, key, segment), into chunks of up to `MetricChunk.COMPACT_POINTS` points whose summaries
and rollup are rebuilt (`tracker.series.chunk_columns`). PostgreSQL stores arrays that large
compressed (TOAST, pglz): consecutive steps take ~3.3 bytes a point instead of 8, times 3.3
(a regular clock) to 5.6 (one jittered by up to 10 ms), constant values ~0.1; noisy values 8.

Why every reader sees the same points in the same order:

* Readers order a series' chunks by (segment, min_step, id) and keep each chunk's array order.
  A unit merges chunks that are consecutive in that order into the row of the first of them
  (its id and min_step stay), its arrays their concatenation in that order, bytes unchanged
  (NaN payloads and -0.0 included).
* Segments are separate series: a resumed attempt's points are never merged with the ones of
  the attempt before, so latest-segment-wins resolves them as it did.

Why it is safe online:

* One transaction per unit (at most COMPACT_POINTS points): it locks its chunks, checks they are
  still the ones planned (a concurrent sweep may have merged them: then it skips, and the next
  sweep plans again), writes the merged row and deletes the others. A crash or abort half-way
  rolls back to the chunks as they were: nothing lost, nothing doubled.
* Ingest never writes a chunk without a batch and retention only clears batch links, so neither
  touches a chunk a unit has locked; duplicate detection (batch rows, seq floors) is untouched.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count

from config import sweeps
from tracker.models import MetricChunk
from tracker.series import chunk_columns, unpack_floats, unpack_steps

# (chunk id, points) of one unit, in reading order.
Unit = list[tuple[int, int]]


@dataclass(frozen=True)
class CompactResult:
    units: int  # merges committed
    merged: int  # chunk rows merged into another one (deleted)
    failed: int  # series whose compaction raised: logged, retried by the next sweep
    done: bool  # False when the time budget ran out first: the next sweep continues


def chunks_compact(
    *,
    budget_s: float = 40.0,
    target: int = MetricChunk.COMPACT_POINTS,
    below: int = MetricChunk.COMPACT_BELOW,
) -> CompactResult:
    """Merge old small chunks (no batch row, fewer than `below` points) of every series into
    chunks of at most `target` points. Idempotent; stops after `budget_s` seconds.

    With nothing to do it is one query on a partial index of the small old chunks."""
    began = time.monotonic()
    units = merged = failed = 0
    for run_id, key, segment in _series_with_work(below=below):
        if time.monotonic() - began >= budget_s:
            return CompactResult(units=units, merged=merged, failed=failed, done=False)
        ok = False
        chunks = _series_chunks(run_id=run_id, key=key, segment=segment)
        with sweeps.unit("compaction of series", (run_id, key, segment)):
            for unit in plan(chunks, target, below):
                if time.monotonic() - began >= budget_s:
                    break
                gone = unit_merge(unit=unit)
                if gone:
                    units += 1
                    merged += gone
            ok = True
        failed += not ok
    return CompactResult(
        units=units, merged=merged, failed=failed, done=time.monotonic() - began < budget_s
    )


def _series_with_work(*, below: int) -> list[tuple[int, str, int]]:
    # Two small old chunks or more: a series whose only one is its partly filled last chunk
    # has nothing to merge (a sweep with no work stops here).
    rows = (
        MetricChunk.objects.filter(batch__isnull=True, n__lt=below)
        .values("run_id", "key", "segment")
        .annotate(small=Count("id"))
        .filter(small__gte=2)
        .order_by("run_id", "key", "segment")
        .values_list("run_id", "key", "segment")
    )
    return list(rows)


def _series_chunks(*, run_id: int, key: str, segment: int) -> Iterator[tuple[int, int, bool]]:
    rows = (
        MetricChunk.objects.filter(run_id=run_id, key=key, segment=segment)
        .order_by("min_step", "id")  # the readers' order within a segment
        .values_list("id", "n", "batch_id")
    )
    for chunk_id, n, batch_id in rows.iterator(chunk_size=10_000):
        yield chunk_id, n, batch_id is None


def plan(chunks: Iterator[tuple[int, int, bool]], target: int, below: int) -> Iterator[Unit]:
    """Units to merge: runs of consecutive old small chunks, at most `target` points each.

    `chunks` is a series' (id, points, old) in reading order. A chunk that is not old (its batch
    row still exists) or not small ends a run, so a unit never reaches over it. A unit closes
    when the next chunk would take it past `target`; then the merged chunk holds more than
    `target - below` points, and a second pass finds nothing to merge: compaction is idempotent.
    """
    unit: Unit = []
    points = 0
    for chunk_id, n, old in chunks:
        if not old or n >= below or points + n > target:
            if len(unit) > 1:
                yield unit
            unit, points = [], 0
            if not old or n >= below:
                continue
        unit.append((chunk_id, n))
        points += n
    if len(unit) > 1:
        yield unit


@transaction.atomic
def unit_merge(*, unit: Unit) -> int:
    """Merge one unit's chunks into the first one's row; returns the rows deleted (0: the chunks
    changed since they were planned, and nothing was written)."""
    ids = [chunk_id for chunk_id, _ in unit]
    # Locked in id order, so two sweeps merging overlapping units cannot deadlock.
    rows = (
        MetricChunk.objects.select_for_update()
        .filter(id__in=ids, batch__isnull=True)
        .order_by("id")
        .values_list("id", "n", "steps", "values", "times")
    )
    blobs: dict[int, tuple[bytes, bytes, bytes]] = {}
    locked: dict[int, int] = {}
    for chunk_id, n, s, v, t in rows:
        locked[chunk_id] = n
        blobs[chunk_id] = (bytes(s), bytes(v), bytes(t))
    if locked != dict(unit):
        return 0
    steps = unpack_steps(b"".join(blobs[i][0] for i in ids))
    values = unpack_floats(b"".join(blobs[i][1] for i in ids))
    times = unpack_floats(b"".join(blobs[i][2] for i in ids))
    MetricChunk.objects.filter(id=ids[0]).update(**chunk_columns(steps, values, times))
    return chunks_delete(ids=ids[1:])


def chunks_delete(*, ids: list[int]) -> int:
    count, _ = MetricChunk.objects.filter(id__in=ids).delete()
    return count
