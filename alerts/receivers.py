"""Enqueue alert work when tracker or forecasting commits something. Only enqueues."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from alerts.models import Notification
from alerts.tasks import deliver_notification, dispatch_enqueue, dispatch_run_end
from forecasting.models import Flag
from tracker.signals import run_finished

# The run's last forecast (run_finished enqueues it too) may raise the flag that says why it
# ended, a NaN seconds before a crash: its alert should come before the ending's, not after.
RUN_END_DELAY_S = 20


@receiver(run_finished)
def _on_run_finished(sender: Any, run_id: int, **kwargs: Any) -> None:
    # tracker sends this after commit already.
    dispatch_run_end.apply_async(args=[run_id], countdown=RUN_END_DELAY_S)


@receiver(post_save, sender=Flag)
def _on_flag_written(sender: Any, instance: Flag, created: bool, **kwargs: Any) -> None:
    # forecasting sends no signal of its own for new flags; the outbox row is the event.
    # robust: a broker hiccup must not fail forecasting's transaction callbacks.
    if created:
        transaction.on_commit(dispatch_enqueue, robust=True)


@receiver(post_save, sender=Notification)
def _on_notification_created(
    sender: Any, instance: Notification, created: bool, **kwargs: Any
) -> None:
    # A new pending notification is delivered after its row commits (a rollback sends nothing);
    # the sweep re-enqueues one whose message was lost.
    if created and instance.status == Notification.Status.PENDING:
        notification_id = instance.pk
        transaction.on_commit(lambda: deliver_notification.delay(notification_id), robust=True)
