"""Thin Celery tasks on the `alerts` queue: take ids, call a service. All idempotent.

Enqueueing lives here and in receivers, never in services (they know no Celery)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.core.cache import cache

from alerts import services

DISPATCH_PENDING_KEY = "runcast:alerts-dispatch-pending"
DISPATCH_DEBOUNCE_S = 10


@shared_task(soft_time_limit=50, time_limit=60)
def dispatch_flags() -> None:
    # Clear the marker first: flags committed during this run enqueue the next one.
    cache.delete(DISPATCH_PENDING_KEY)
    services.flags_dispatch()


@shared_task(soft_time_limit=30, time_limit=45)
def dispatch_run_end(run_id: int) -> None:
    services.run_end_dispatch(run_id=run_id)


@shared_task(soft_time_limit=45, time_limit=60)
def deliver_notification(notification_id: int) -> None:
    retry_in = services.notification_deliver(notification_id=notification_id)
    # The row holds next_attempt_at: an early or duplicate copy of this message no-ops, and the
    # sweeper enqueues it when due if no message is queued. A later retry (the backoff reaches an
    # hour) is left to the sweep: a message held past the broker's visibility timeout would be
    # handed out again meanwhile (config/settings/base.py).
    if retry_in is not None and retry_in <= settings.RUNCAST_MAX_COUNTDOWN_S:
        deliver_notification.apply_async(args=[notification_id], countdown=retry_in)


def dispatch_enqueue() -> None:
    """One dispatch for a burst of flags (flags_sync writes several in one transaction); the
    task clears the marker when it starts, and the beat sweep catches anything missed."""
    if cache.add(DISPATCH_PENDING_KEY, 1, timeout=DISPATCH_DEBOUNCE_S):
        dispatch_flags.delay()


@shared_task(soft_time_limit=50, time_limit=60)
def sweep_alerts() -> None:
    for notification_id in services.alerts_sweep():
        deliver_notification.delay(notification_id)


@shared_task(soft_time_limit=300, time_limit=330)
def send_digests() -> None:
    services.digests_send_due()
