"""Channels (where to tell), rules (what to tell) and notifications (one delivery each).

A Notification row per (event, channel) is what makes delivery exactly-once: the dispatcher can
only create it once (unique key) and a worker can only claim it once (conditional UPDATE).
"""

from __future__ import annotations

import secrets
import uuid
from datetime import timedelta

from django.db import models
from django.utils import timezone

from alerts.kinds import RULE_KINDS
from forecasting.models import Flag
from tracker.models import Project, Run


def _new_secret() -> str:
    return secrets.token_urlsafe(32)


class Severity(models.TextChoices):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Channel(models.Model):
    class Kind(models.TextChoices):
        EMAIL = "email"
        SLACK = "slack", "Slack"
        WEBHOOK = "webhook"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_channels")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=100)
    # Email: addresses, one per line. Slack: the incoming-webhook URL. Webhook: the endpoint URL.
    target = models.TextField()
    # Signs webhook bodies (HMAC-SHA256). Must be readable to sign, so it is not hashed.
    secret = models.CharField(max_length=64, default=_new_secret, blank=True)
    enabled = models.BooleanField(default=True)
    # Why delivery stopped (a permanent error), shown on the channel list until re-enabled.
    disabled_reason = models.TextField(blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["project", "name", "id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def email_addresses(self) -> list[str]:
        return [a.strip() for a in self.target.replace(",", "\n").splitlines() if a.strip()]


class Rule(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_rules")
    kind = models.CharField(max_length=32, choices=[(k.key, k.label) for k in RULE_KINDS])
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    threshold = models.FloatField(null=True, blank=True)
    # No channels selected means every enabled channel of the project.
    channels = models.ManyToManyField(Channel, blank=True, related_name="rules")
    muted = models.BooleanField(default=False)
    # A flapping flag re-raises within this window: the repeat is recorded, not sent.
    cooldown = models.DurationField(default=timedelta(hours=1))

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "kind"], name="alert_rule_unique_kind")
        ]
        ordering = ["project", "id"]

    def __str__(self) -> str:
        return f"{self.kind} rule of {self.project}"


class Notification(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        SENDING = "sending"
        SENT = "sent"
        FAILED = "failed"
        SUPPRESSED = "suppressed"

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # None: the rule matched but the project has no channel; recorded (not sent) so the history
    # shows what would have been said.
    channel = models.ForeignKey(
        Channel, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="alert_notifications")
    flag = models.ForeignKey(
        Flag, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    # "flag:<id>" or "run:<id>:<status>:<ended_at>": one delivery per event per channel.
    event_key = models.CharField(max_length=128)
    rule_kind = models.CharField(max_length=32)
    # The flag kind ("nan", "rise", ...) or how the run ended ("finished", "failed", "crashed";
    # rows made before crashes had their own kind say "failed" for both).
    kind = models.CharField(max_length=32)
    # raised / updated / resolved for flags; "ended" for run endings.
    event = models.CharField(max_length=16)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # Why it was suppressed, or the last delivery error.
    reason = models.TextField(blank=True)
    tries = models.PositiveIntegerField(default=0)
    # The message as rendered when the row was made (alerts.messages.Message.as_json): what every
    # try sends and what the history shows, whatever the run or its flags say later. A message
    # rendered at each try, and re-rendered by the history, told a crash that had since resumed
    # as "... running" (issue 23). Empty on rows made before messages were kept.
    rendered = models.JSONField(default=dict, blank=True)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["event_key", "channel"], name="notification_unique_event_channel"
            ),
            # NULLs are distinct in a unique index: the channel-less row needs its own.
            models.UniqueConstraint(
                fields=["event_key"],
                condition=models.Q(channel__isnull=True),
                name="notification_unique_event_no_channel",
            ),
        ]
        indexes = [
            # The sweeper re-enqueues due retries and finds sends a dead worker left behind.
            models.Index(fields=["status", "next_attempt_at"], name="notification_due_idx"),
            # Cooldown and "was the raise reported" look back per (run, channel, kind).
            models.Index(
                fields=["run", "channel", "rule_kind", "created_at"], name="notif_cool_idx"
            ),
        ]
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.event} on {self.run} via {self.channel} ({self.status})"


class Digest(models.Model):
    """One daily summary per project per local day: its row makes it exactly-once."""

    class Status(models.TextChoices):
        SENDING = "sending"
        SENT = "sent"
        FAILED = "failed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_digests")
    day = models.DateField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SENDING)
    recipients = models.JSONField(default=list)
    tries = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "day"], name="digest_unique_project_day")
        ]

    def __str__(self) -> str:
        return f"digest of {self.project} for {self.day}"
