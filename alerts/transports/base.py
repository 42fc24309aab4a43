"""What every transport is: notify(message) or raise TransportError(message, permanent)."""

from __future__ import annotations

from typing import TYPE_CHECKING

# Defined by the outbound HTTP seam, which raises it; every transport raises it too.
from config.outbound import TransportError

if TYPE_CHECKING:
    from alerts.messages import Message
    from alerts.models import Channel


__all__ = ["Transport", "TransportError"]


class Transport:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def notify(self, message: Message) -> None:
        raise NotImplementedError
