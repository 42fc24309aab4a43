"""What every transport is: notify(message) or raise TransportError(message, permanent)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings

# Defined by the outbound HTTP seam, which raises it; every transport raises it too.
from config.outbound import TransportError

if TYPE_CHECKING:
    from alerts.messages import Message
    from alerts.models import Channel


__all__ = ["Transport", "TransportError"]


class Transport:
    def __init__(self, channel: Channel, *, timeout: float | None = None) -> None:
        self.channel = channel
        # The deadline of an HTTP request (Slack, webhook): the delivery setting, unless the
        # caller has someone waiting on the answer (a test message sent from the page).
        self.timeout = settings.RUNCAST_ALERTS_HTTP_TIMEOUT if timeout is None else timeout

    def notify(self, message: Message) -> None:
        raise NotImplementedError
