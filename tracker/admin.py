"""The operator's view of tracked data (/admin/, superusers and staff with view permissions).

Rows that services keep consistent (run summaries, segments, batches, chunks, events, token
hashes, invitations) are read-only here: an edit would break what ingestion and the pages rely
on. Hashes and secrets are never shown. People and projects are managed in the web UI, where the
rules hold (a project keeps an owner); the admin can still add a membership (to rescue a project
whose owners left) and delete one that is not the last owner.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from tracker.models import (
    ApiToken,
    Deadline,
    Event,
    GpuEpisode,
    Host,
    HostBatch,
    HostProcess,
    IngestBatch,
    Invitation,
    LatestMetric,
    Membership,
    MetricChunk,
    Project,
    RankTimingBlock,
    RankTimingChunk,
    RankTimingRollup,
    Run,
    RunProcess,
    RunSegment,
    SavedView,
)
from tracker.services import token_revoke


class ReadOnlyAdmin(admin.ModelAdmin):
    """Inspect, never add or edit (deletion follows the model's own permission)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ("user", "role")
    readonly_fields = ("user", "role")
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "timezone", "gpu_hour_price", "currency", "created_at")
    search_fields = ("slug", "name")
    inlines = [MembershipInline]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Trainers name the project by slug in runcast.init(project=...): it never changes.
        return ("slug", "created_at") if obj is not None else ("created_at",)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "project", "role")
    list_filter = ("role", "project")
    search_fields = ("user__username", "user__email", "project__slug")
    raw_id_fields = ("user", "project")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Role changes happen on the settings page, which keeps every project an owner.
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.role == Membership.Role.OWNER:
            owners = Membership.objects.filter(project_id=obj.project_id, role=obj.role)
            if owners.count() <= 1:
                return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Bulk deletion would skip the per-row last-owner check.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "project",
        "scope",
        "masked",
        "created_by",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("scope", ("revoked_at", admin.EmptyFieldListFilter), "project")
    search_fields = ("name", "prefix", "project__slug")
    fields = ("project", "name", "scope", "masked", "created_by", "created_at", "last_used_at")
    readonly_fields = fields
    actions = ["revoke"]

    @admin.display(description="token")
    def masked(self, token: ApiToken) -> str:
        return f"rc_{token.prefix}_…"

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            token_revoke(token=token)
        self.message_user(request, f"revoked {queryset.count()} token(s)", messages.SUCCESS)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Revoked tokens stay: "who had access, and when" must remain answerable.
        return False


@admin.register(Invitation)
class InvitationAdmin(ReadOnlyAdmin):
    list_display = ("email", "project", "role", "invited_by", "created_at", "expires_at", "state")
    list_filter = ("role", "project")
    search_fields = ("email", "project__slug")
    fields = (
        "project",
        "email",
        "role",
        "invited_by",
        "created_at",
        "expires_at",
        "accepted_at",
        "accepted_by",
        "revoked_at",
    )
    readonly_fields = fields
    actions = ["revoke"]

    @admin.display(description="state")
    def state(self, invitation: Invitation) -> str:
        if invitation.accepted_at:
            return "accepted"
        if invitation.revoked_at:
            return "revoked"
        return "pending" if invitation.is_pending(timezone.now()) else "expired"

    @admin.action(description="Revoke the selected invitations")
    def revoke(self, request: HttpRequest, queryset: QuerySet[Invitation]) -> None:
        n = queryset.filter(accepted_at__isnull=True, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        self.message_user(request, f"revoked {n} invitation(s)", messages.SUCCESS)


@admin.register(Deadline)
class DeadlineAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "project", "cutoff", "timezone", "buffer")
    list_filter = ("project",)
    search_fields = ("name", "slug", "project__slug")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Trainers refer to the slug in runcast.init(deadline=...).
        return ("slug",) if obj is not None else ()


@admin.register(SavedView)
class SavedViewAdmin(admin.ModelAdmin):
    # A runs explorer view: its query string is the view (filter, sort, columns, group).
    list_display = ("name", "project", "query", "created_by", "created_at")
    list_filter = ("project",)
    search_fields = ("name", "project__slug", "query")


class SegmentInline(admin.TabularInline):
    model = RunSegment
    extra = 0
    can_delete = False
    fields = ("number", "session", "started_at", "first_step", "previous_last_step")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = (
        "public_id",
        "name",
        "project",
        "status",
        "last_step",
        "total_steps",
        "points_count",
        "last_seen_at",
        "created_by_token",
    )
    list_filter = ("status", "project", "progress_unit")
    search_fields = ("public_id", "name", "project__slug")
    date_hierarchy = "started_at"
    list_select_related = ("project", "created_by_token")
    inlines = [SegmentInline]
    # Deleting a run (points, forecasts, flags and alert history with it) stays possible: an
    # operator's call. Everything else about a run is written by ingestion.


@admin.register(RunSegment)
class RunSegmentAdmin(ReadOnlyAdmin):
    list_display = ("run", "number", "session", "started_at", "first_step", "previous_last_step")
    search_fields = ("run__public_id", "session")
    raw_id_fields = ("run",)
    list_select_related = ("run",)


@admin.register(LatestMetric)
class LatestMetricAdmin(ReadOnlyAdmin):
    list_display = ("run", "key", "value", "step", "timestamp_ms")
    search_fields = ("run__public_id", "key")
    list_select_related = ("run",)


@admin.register(IngestBatch)
class IngestBatchAdmin(ReadOnlyAdmin):
    list_display = ("run", "session", "seq", "points", "received_at", "heartbeat_at")
    search_fields = ("run__public_id", "session")
    date_hierarchy = "received_at"
    list_select_related = ("run",)
    show_full_result_count = False  # a COUNT over millions of batches per page view is slow


@admin.register(RankTimingRollup)
class RankTimingRollupAdmin(ReadOnlyAdmin):
    list_display = ("run", "through_id", "top_step", "floor_step")
    search_fields = ("run__public_id",)
    list_select_related = ("run",)


@admin.register(RankTimingBlock)
class RankTimingBlockAdmin(ReadOnlyAdmin):
    list_display = ("run", "lo")
    search_fields = ("run__public_id",)
    list_select_related = ("run",)
    show_full_result_count = False
    # The packed matrices are binary: the block's first step and its run say what it holds.
    fields = ("run", "lo", "hosts")


@admin.register(RankTimingChunk)
class RankTimingChunkAdmin(ReadOnlyAdmin):
    list_display = ("run", "rank", "host", "local_rank", "n", "min_step", "max_step", "received_at")
    search_fields = ("run__public_id", "host")
    list_select_related = ("run",)
    show_full_result_count = False
    # The packed arrays are binary: the summary columns say what a chunk holds.
    fields = (
        "run",
        "session",
        "seq",
        "rank",
        "local_rank",
        "host",
        "n",
        "min_step",
        "max_step",
        "received_at",
    )


@admin.register(MetricChunk)
class MetricChunkAdmin(ReadOnlyAdmin):
    list_display = ("run", "key", "segment", "n", "min_step", "max_step", "nonfinite")
    search_fields = ("run__public_id", "key")
    list_filter = ("segment",)
    list_select_related = ("run",)
    show_full_result_count = False
    # The packed arrays are binary: the summary columns say what a chunk holds.
    fields = (
        "run",
        "batch",
        "key",
        "segment",
        "n",
        "first_step",
        "last_step",
        "min_step",
        "max_step",
        "min_value",
        "max_value",
        "nonfinite",
    )
    readonly_fields = fields


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("run", "kind", "step", "time", "segment")
    list_filter = ("kind",)
    search_fields = ("run__public_id",)
    list_select_related = ("run",)
    fields = ("run", "batch", "kind", "step", "time", "segment", "payload")
    readonly_fields = fields


# -- GPU telemetry (tracker/gpu/models.py): written by the agent's batches and the GPU check ----


@admin.register(Host)
class HostAdmin(ReadOnlyAdmin):
    list_display = ("name", "project", "boot_id", "last_seen_at")
    search_fields = ("name", "project__slug")
    list_select_related = ("project",)


@admin.register(HostBatch)
class HostBatchAdmin(ReadOnlyAdmin):
    list_display = ("host", "session", "seq", "t0", "t1", "received_at")
    search_fields = ("host__name", "session")
    list_select_related = ("host",)
    show_full_result_count = False
    # The packed points are binary: the time range, keys and summary say what a batch holds.
    fields = ("host", "session", "seq", "t0", "t1", "keys", "summary", "received_at")
    readonly_fields = fields


@admin.register(HostProcess)
class HostProcessAdmin(ReadOnlyAdmin):
    list_display = ("host", "pid", "user", "container", "cmdline")
    search_fields = ("host__name", "cmdline", "user", "container")
    list_select_related = ("host",)


@admin.register(RunProcess)
class RunProcessAdmin(ReadOnlyAdmin):
    list_display = ("run", "host", "ns_pid", "container", "cuda_visible_devices")
    search_fields = ("run__public_id", "host")
    list_select_related = ("run",)


@admin.register(GpuEpisode)
class GpuEpisodeAdmin(ReadOnlyAdmin):
    list_display = ("host", "run", "kind", "explained", "start", "end")
    list_filter = ("explained", "kind")
    search_fields = ("host__name", "run__public_id")
    list_select_related = ("host", "run")
