"""Reads behind the project settings page."""

from __future__ import annotations

from django.db.models import QuerySet

from tracker.models import ApiToken, Deadline, Membership, Project


def membership_list(*, project: Project) -> QuerySet[Membership]:
    return (
        Membership.objects.select_related("user").filter(project=project).order_by("user__username")
    )


def membership_get_by_id(*, project: Project, membership_id: int) -> Membership | None:
    return (
        Membership.objects.select_related("user", "project")
        .filter(project=project, pk=membership_id)
        .first()
    )


def token_list(*, project: Project) -> QuerySet[ApiToken]:
    # Revoked tokens stay listed (greyed) so "who had access" is answerable.
    return (
        ApiToken.objects.select_related("created_by")
        .filter(project=project)
        .order_by("revoked_at", "-created_at")
    )


def token_get(*, project: Project, token_id: int) -> ApiToken | None:
    return ApiToken.objects.filter(project=project, pk=token_id).first()


def deadline_list(*, project: Project) -> QuerySet[Deadline]:
    return Deadline.objects.filter(project=project).order_by("cutoff")


def deadline_get(*, project: Project, slug: str) -> Deadline | None:
    return Deadline.objects.filter(project=project, slug=slug).first()
