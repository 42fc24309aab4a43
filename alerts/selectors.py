"""Reads for pages and the digest. None of them writes."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q, QuerySet

from alerts.models import Channel, Notification, Rule
from forecasting.selectors import RunOutlook, outlooks_for, with_latest_forecasts
from tracker.models import Project, Run


def channel_list(*, project: Project) -> QuerySet[Channel]:
    return Channel.objects.filter(project=project).order_by("name", "id")


def channel_get(*, project: Project, channel_id: int) -> Channel | None:
    return Channel.objects.filter(project=project, pk=channel_id).first()


def rule_list(*, project: Project) -> QuerySet[Rule]:
    return Rule.objects.filter(project=project).prefetch_related("channels").order_by("id")


def rule_get(*, project: Project, rule_id: int) -> Rule | None:
    return Rule.objects.filter(project=project, pk=rule_id).first()


def notification_list(*, project: Project, run: Run | None = None) -> QuerySet[Notification]:
    qs = Notification.objects.select_related("channel", "run").filter(channel__project=project)
    if run is not None:
        qs = qs.filter(run=run)
    return qs.order_by("-created_at", "-id")


def digest_runs(*, project: Project, now: datetime) -> list[RunOutlook]:
    """Active runs and those that ended in the last day, with their latest forecasts and open
    flags (a constant number of queries, whatever the number of runs)."""
    runs = list(
        with_latest_forecasts(
            Run.objects.select_related("deadline")
            .filter(project=project)
            .filter(Q(status__in=Run.ACTIVE_STATUSES) | Q(ended_at__gte=now - timedelta(days=1)))
            .order_by("deadline__cutoff", "-last_seen_at"),
            now=now,
        )[:100]
    )
    for run in runs:
        run.project = project  # already loaded: no join per run
    return outlooks_for(runs)
