"""Email over Django's mail framework (SMTP in production): plain text plus HTML."""

from __future__ import annotations

import smtplib

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection

from alerts.messages import Message
from alerts.transports.base import Transport, TransportError

# 5xx replies about the mailbox or address: retrying the same address cannot succeed.
PERMANENT_SMTP_CODES = frozenset({501, 550, 551, 553, 554})


def _smtp_error(e: smtplib.SMTPException) -> TransportError:
    if isinstance(e, smtplib.SMTPRecipientsRefused):
        codes = {code for code, _ in e.recipients.values()}
        refused = ", ".join(sorted(e.recipients))
        permanent = bool(codes) and all(c >= 500 for c in codes)
        text = f"recipient refused: {refused} ({sorted(codes)})"
        return TransportError(text, permanent=permanent)
    if isinstance(e, smtplib.SMTPResponseException):
        text = e.smtp_error.decode("utf-8", "replace") if isinstance(e.smtp_error, bytes) else ""
        return TransportError(
            f"SMTP {e.smtp_code}: {text}"[:500], permanent=e.smtp_code in PERMANENT_SMTP_CODES
        )
    return TransportError(f"SMTP error: {e}"[:500], permanent=False)


def send_email(
    *, to: list[str], subject: str, text: str, html: str, headers: dict[str, str] | None = None
) -> None:
    """Send one multipart email; raise TransportError. Also used by the daily digest."""
    if not to:
        raise TransportError("no email address configured", permanent=True)
    connection = get_connection(timeout=settings.RUNCAST_ALERTS_SMTP_TIMEOUT)
    mail = EmailMultiAlternatives(
        subject=subject,
        body=text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=to,
        headers=headers or {},
        connection=connection,
    )
    mail.attach_alternative(html, "text/html")
    try:
        mail.send(fail_silently=False)
    except smtplib.SMTPException as e:
        raise _smtp_error(e) from e
    except TimeoutError as e:
        raise TransportError("SMTP server timed out", permanent=False) from e
    except OSError as e:
        raise TransportError(f"SMTP connection failed: {e}", permanent=False) from e


class EmailTransport(Transport):
    def notify(self, message: Message) -> None:
        event_id = message.payload.get("id")
        headers = {"X-Runcast-Notification": str(event_id)} if event_id else {}
        send_email(
            to=self.channel.email_addresses,
            subject=message.subject,
            text=message.text,
            html=message.html,
            headers=headers,
        )
