"""What every transport is: notify(message) or raise TransportError(message, permanent)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alerts.messages import Message
    from alerts.models import Channel


class TransportError(Exception):
    """A failed delivery. permanent=True means retrying cannot help (bad address, revoked
    webhook): the channel is disabled and the reason shown. Otherwise it is retried."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


class Transport:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def notify(self, message: Message) -> None:
        raise NotImplementedError
