"""Retention of the write path's bookkeeping: ingest-batch rows older than the dedupe window.

An `IngestBatch` row exists so that a retried or replayed batch changes nothing, and its
received time is a heartbeat for the liveness check. Neither needs it forever:

* liveness reads the newest 500 batches of a run (minutes to hours of them);
* dedupe: the client delivers a session's batches in seq order (live, spooled, or replayed by
  `runcast sync`), never one behind a later one it already delivered, except one it gave up on
  (the server refused it, or the spool cap dropped it). So once a session's batches up to seq N
  are deleted, `RunSegment.seq_floor = N` answers any replay of them as a duplicate, forever.

Points and events stay: their batch link is set to null (`MetricChunk.batch`, `Event.batch`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Value
from django.db.models.functions import Coalesce, Greatest

from tracker.models import Event, IngestBatch, MetricChunk, RunSegment

# The window can be made shorter, not shorter than this. Defence in depth: should two processes
# ever deliver one session's batches out of order (a `runcast sync` racing a live sender it took
# for dead), the rows, not the floor, catch the overlap.
MIN_KEEP = timedelta(days=1)
# Rows per transaction: each pass holds its locks for well under a second.
CHUNK_ROWS = 5_000


@dataclass(frozen=True)
class ThinResult:
    deleted: int
    done: bool  # False when the time budget ran out first: the next tick continues


def batch_keep_window() -> timedelta:
    return max(MIN_KEEP, timedelta(days=settings.RUNCAST_BATCH_KEEP_DAYS))


def batches_thin(*, now: datetime, budget_s: float = 40.0) -> ThinResult:
    """Delete batch rows received before now - RUNCAST_BATCH_KEEP_DAYS, oldest first, raising
    each session's seq floor first. Idempotent; stops after `budget_s` seconds."""
    cutoff = now - batch_keep_window()
    began = time.monotonic()
    deleted = 0
    while time.monotonic() - began < budget_s:
        count = _thin_chunk(cutoff=cutoff)
        deleted += count
        if count < CHUNK_ROWS:
            return ThinResult(deleted=deleted, done=True)
    return ThinResult(deleted=deleted, done=False)


@transaction.atomic
def _thin_chunk(*, cutoff: datetime) -> int:
    ids = list(
        IngestBatch.objects.filter(received_at__lt=cutoff)
        .order_by("received_at", "id")
        .values_list("id", flat=True)[:CHUNK_ROWS]
    )
    if not ids:
        return 0
    old = IngestBatch.objects.filter(id__in=ids)
    # The floor first, in the same transaction: no moment where a deleted key is unguarded.
    for row in old.values("run_id", "session").annotate(top=Max("seq")):
        RunSegment.objects.filter(run_id=row["run_id"], session=row["session"]).update(
            seq_floor=Greatest(Coalesce("seq_floor", Value(row["top"])), Value(row["top"]))
        )
    MetricChunk.objects.filter(batch_id__in=ids).update(batch=None)
    Event.objects.filter(batch_id__in=ids).update(batch=None)
    count, _ = old.delete()
    return count
