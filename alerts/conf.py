"""Alert settings: a Django setting wins, then the environment, then the default.

They live here, not in config/settings, so the alerts app carries its own knobs (docs/alerts.md).
"""

from __future__ import annotations

import os

from django.conf import settings


def _get(name: str, default: float) -> float:
    value = getattr(settings, name, None)
    if value is None:
        return float(os.environ.get(name) or default)
    return float(value)


def http_timeout_s() -> float:
    return _get("RUNCAST_ALERTS_HTTP_TIMEOUT", 10.0)


def smtp_timeout_s() -> float:
    return _get("RUNCAST_ALERTS_SMTP_TIMEOUT", 20.0)


def max_tries() -> int:
    return int(_get("RUNCAST_ALERTS_MAX_TRIES", 5))


def backoff_base_s() -> float:
    return _get("RUNCAST_ALERTS_BACKOFF_BASE", 30.0)


def digest_hour() -> int:
    """Local hour (project timezone) from which the daily digest goes out."""
    return int(_get("RUNCAST_ALERTS_DIGEST_HOUR", 8))


def allow_private_targets() -> bool:
    """Let Slack and webhook channels reach loopback, private and link-local addresses: for an
    on-premise receiver. Off by default: any project member chooses these URLs (SSRF)."""
    value = getattr(settings, "RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS", None)
    if value is None:
        value = os.environ.get("RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS", "")
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def slack_webhook_url() -> str:
    return str(
        getattr(settings, "RUNCAST_SLACK_WEBHOOK_URL", "")
        or os.environ.get("RUNCAST_SLACK_WEBHOOK_URL", "")
    )


def alert_emails() -> str:
    """Addresses (comma-separated in the variable) for a project's default email channel."""
    raw = str(
        getattr(settings, "RUNCAST_ALERT_EMAIL", "") or os.environ.get("RUNCAST_ALERT_EMAIL", "")
    )
    return "\n".join(a.strip() for a in raw.split(",") if a.strip())
