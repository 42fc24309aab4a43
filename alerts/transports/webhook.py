"""Generic webhooks: the JSON event, signed so the receiver can trust and de-duplicate it.

X-Runcast-Signature is HMAC-SHA256 with the channel secret over "<timestamp>.<body>" and
X-Runcast-Timestamp carries that timestamp: signing the timestamp with the body is what stops a
captured request from being replayed later with a fresh timestamp (the Stripe scheme).
X-Runcast-Delivery is the notification id, the same on every retry, for receiver-side dedup.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from alerts.messages import Message
from alerts.transports.base import Transport, TransportError
from config import outbound as http

# The endpoint is gone: retrying cannot help.
PERMANENT_STATUSES = frozenset({404, 410})


def sign(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify(
    secret: str, timestamp: str, body: bytes, signature: str, *, now: float, tolerance_s: int = 300
) -> bool:
    """What a receiver does (documented in docs/alerts.md); used by the tests."""
    if abs(now - int(timestamp)) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


class WebhookTransport(Transport):
    def notify(self, message: Message) -> None:
        body = http.encode(message.payload)
        timestamp = str(int(time.time()))
        headers = {
            "X-Runcast-Timestamp": timestamp,
            "X-Runcast-Signature": sign(self.channel.secret, timestamp, body),
            "X-Runcast-Event": f"{message.payload.get('kind')}.{message.payload.get('event')}",
        }
        if message.payload.get("id"):
            headers["X-Runcast-Delivery"] = str(message.payload["id"])
        response = http.post_json(self.channel.target, body, headers, timeout=self.timeout)
        if 200 <= response.status < 300:
            return
        # The status only: the body is the receiver's (or, for a hostile URL, someone else's)
        # page, and the error is shown on the channel page.
        redirect = " (redirects are not followed)" if 300 <= response.status < 400 else ""
        raise TransportError(
            f"webhook answered {response.status}{redirect}",
            permanent=response.status in PERMANENT_STATUSES,
        )
