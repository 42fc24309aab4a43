"""Reads for pages and the digest. None of them writes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet

from alerts.models import Channel, Notification, Rule
from forecasting.models import Forecast
from forecasting.selectors import forecast_latest, open_flags_by_run
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


def digest_runs(*, project: Project, now: datetime) -> list[dict[str, Any]]:
    """Active runs and those that ended in the last day, with their latest forecasts."""
    runs = list(
        Run.objects.select_related("deadline")
        .filter(project=project)
        .filter(Q(status__in=Run.ACTIVE_STATUSES) | Q(ended_at__gte=now - timedelta(days=1)))
        .order_by("deadline__cutoff", "-last_seen_at")[:100]
    )
    flags = open_flags_by_run([r.pk for r in runs])
    rows = []
    for run in runs:
        eta = forecast_latest(run=run, kind=Forecast.Kind.ETA)
        risk = forecast_latest(run=run, kind=Forecast.Kind.DEADLINE)
        rows.append(
            {
                "run": run,
                "p50": eta.finish_p50 if eta else None,
                "p_on_time": (risk.data or {}).get("p_on_time") if risk else None,
                "open_flags": sorted(f.kind for f in flags.get(run.pk, [])),
            }
        )
    return rows
