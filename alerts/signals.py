"""Signals alerts' services send after commit, so that services know no Celery: receivers
(alerts/receivers.py) enqueue the work."""

from __future__ import annotations

from django.dispatch import Signal

# Sent after a pending Notification row commits; kwargs: notification_id.
notification_created = Signal()
