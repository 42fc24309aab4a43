"""Transports: Transport(channel).notify(message), raising TransportError(message, permanent)."""

from __future__ import annotations

from alerts.models import Channel
from alerts.transports.base import Transport, TransportError
from alerts.transports.email import EmailTransport
from alerts.transports.slack import SlackTransport
from alerts.transports.webhook import WebhookTransport

TRANSPORTS: dict[str, type[Transport]] = {
    Channel.Kind.EMAIL: EmailTransport,
    Channel.Kind.SLACK: SlackTransport,
    Channel.Kind.WEBHOOK: WebhookTransport,
}


def transport_for(channel: Channel, *, timeout: float | None = None) -> Transport:
    """`timeout`: the deadline of an HTTP request, when not the delivery setting's."""
    return TRANSPORTS[channel.kind](channel, timeout=timeout)


__all__ = ["Transport", "TransportError", "transport_for"]
