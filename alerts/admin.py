from __future__ import annotations

from django.contrib import admin

from alerts.models import Channel, Digest, Notification, Rule


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "kind", "enabled", "disabled_reason")
    list_filter = ("kind", "enabled")


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    list_display = ("project", "kind", "severity", "threshold", "muted")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("created_at", "run", "kind", "event", "channel", "status", "tries")
    list_filter = ("status", "kind")
    raw_id_fields = ("run", "flag", "channel")


@admin.register(Digest)
class DigestAdmin(admin.ModelAdmin):
    list_display = ("project", "day", "status", "tries")
