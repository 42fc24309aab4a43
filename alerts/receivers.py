"""Enqueue alert work when tracker or forecasting commits something. Only enqueues.

Each signal here is sent explicitly, after commit, by the one writer of its rows: tracker's
run_finished by the run lifecycle, forecasting's flags_written by forecasting.flags, and
notification_created by alerts.services. No work starts from a model's post_save.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from alerts.signals import notification_created
from alerts.tasks import deliver_notification, dispatch_enqueue, dispatch_run_end
from forecasting.signals import flags_written
from tracker.signals import run_finished

# The run's last forecast (run_finished enqueues it too) may raise the flag that says why it
# ended, a NaN seconds before a crash: its alert should come before the ending's, not after.
RUN_END_DELAY_S = 20


@receiver(run_finished)
def _on_run_finished(sender: Any, run_id: int, **kwargs: Any) -> None:
    # tracker sends this after commit already.
    dispatch_run_end.apply_async(args=[run_id], countdown=RUN_END_DELAY_S)


@receiver(flags_written)
def _on_flags_written(sender: Any, flag_ids: list[int], **kwargs: Any) -> None:
    # Sent after commit; one debounced dispatch for a burst of rows.
    dispatch_enqueue()


@receiver(notification_created)
def _on_notification_created(sender: Any, notification_id: int, **kwargs: Any) -> None:
    # Sent after the pending row commits (a rollback sends nothing); the sweep re-enqueues one
    # whose message was lost.
    deliver_notification.delay(notification_id)
