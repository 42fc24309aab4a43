"""Enqueue alert work when tracker or forecasting commits something. Only enqueues."""

from __future__ import annotations

from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from forecasting.models import Flag
from tracker.signals import run_finished

DISPATCH_DEBOUNCE_S = 10


@receiver(run_finished)
def _on_run_finished(sender: Any, run_id: int, **kwargs: Any) -> None:
    from alerts.tasks import dispatch_run_end

    # tracker sends this after commit already.
    dispatch_run_end.delay(run_id)


def _enqueue_dispatch() -> None:
    from alerts.tasks import DISPATCH_PENDING_KEY, dispatch_flags

    # One dispatch for a burst of flags (flags_sync writes several in one transaction); the
    # task clears the marker when it starts, and the beat sweep catches anything missed.
    if cache.add(DISPATCH_PENDING_KEY, 1, timeout=DISPATCH_DEBOUNCE_S):
        dispatch_flags.delay()


@receiver(post_save, sender=Flag)
def _on_flag_written(sender: Any, instance: Flag, created: bool, **kwargs: Any) -> None:
    # forecasting sends no signal of its own for new flags; the outbox row is the event.
    # robust: a broker hiccup must not fail forecasting's transaction callbacks.
    if created:
        transaction.on_commit(_enqueue_dispatch, robust=True)
