"""Alert channels, rules, notifications and digests for operators.

Channels and rules are edited on the project's alert pages too; here a channel's signing secret
is never shown. Notifications and digests are delivery records (the exactly-once ledger), so
read-only.
"""

from __future__ import annotations

from django.contrib import admin

from alerts.models import Channel, Digest, Notification, Rule
from tracker.admin import ReadOnlyAdmin


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "kind", "enabled", "disabled_reason")
    list_filter = ("kind", "enabled", "project")
    search_fields = ("name", "project__slug")
    # The webhook signing secret stays out of the page (and out of any form).
    exclude = ("secret",)
    readonly_fields = ("disabled_at", "created_at")


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    list_display = ("project", "kind", "severity", "threshold", "muted")
    list_filter = ("kind", "severity", "muted", "project")
    search_fields = ("project__slug",)


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "run", "kind", "event", "channel", "status", "tries")
    list_filter = ("status", "kind", "event")
    search_fields = ("run__public_id", "event_key", "reason")
    date_hierarchy = "created_at"
    list_select_related = ("run", "channel")


@admin.register(Digest)
class DigestAdmin(ReadOnlyAdmin):
    list_display = ("project", "day", "status", "tries")
    list_filter = ("status", "project")
