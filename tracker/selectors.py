"""Reads of tracked data. Pages and tasks call these; none of them writes."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from tracker.models import Membership, MetricChunk, Project, Run
from tracker.series import Series, concat, latest_wins


def run_get(*, project: Project, public_id: str) -> Run | None:
    return (
        Run.objects.select_related("project", "deadline")
        .filter(project=project, public_id=public_id)
        .first()
    )


def run_list(*, project: Project, status: str | None = None) -> QuerySet[Run]:
    qs = Run.objects.select_related("project", "deadline").filter(project=project)
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("-last_seen_at")


def projects_for_user(*, user: Any) -> QuerySet[Project]:
    return Project.objects.filter(memberships__user=user).order_by("name")


def membership_get(*, user: Any, project_slug: str) -> Membership | None:
    if not user.is_authenticated:
        return None
    return (
        Membership.objects.select_related("project")
        .filter(user=user, project__slug=project_slug)
        .first()
    )


def run_list_for_user(*, user: Any) -> QuerySet[Run]:
    return (
        Run.objects.select_related("project", "deadline")
        .filter(project__memberships__user=user)
        .order_by("-last_seen_at")
    )


def series_keys(*, run: Run) -> list[str]:
    return list(
        MetricChunk.objects.filter(run=run).order_by("key").values_list("key", flat=True).distinct()
    )


def series_load(*, run: Run, key: str, resolve: bool = True) -> Series:
    """Every point of one key, in storage order; `resolve` applies latest-segment-wins."""
    rows = (
        MetricChunk.objects.filter(run=run, key=key)
        .order_by("segment", "min_step", "id")
        .values_list("segment", "steps", "values", "times")
    )
    series = concat([(seg, bytes(s), bytes(v), bytes(t)) for seg, s, v, t in rows])
    return latest_wins(series) if resolve else series
