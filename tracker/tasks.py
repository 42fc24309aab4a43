"""Thin Celery tasks of the tracker layer: take no model instances, call a service."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from tracker import bulk, compaction, retention


@shared_task(soft_time_limit=120, time_limit=150)
def batches_thin() -> None:
    """Beat: delete ingest-batch rows older than the dedupe window (tracker/retention.py)."""
    retention.batches_thin(now=timezone.now(), budget_s=90.0)


@shared_task(soft_time_limit=300, time_limit=330)
def chunks_compact() -> None:
    """Beat: merge old one-batch metric chunks into large ones (tracker/compaction.py)."""
    compaction.chunks_compact(budget_s=240.0)


@shared_task(soft_time_limit=120, time_limit=150)
def runs_purge() -> None:
    """Beat: delete for good the runs deleted longer ago than their keep (tracker/bulk.py)."""
    bulk.runs_purge(now=timezone.now(), budget_s=90.0)
