"""Reads for pages and the digest. None of them writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q, QuerySet

from alerts.kinds import RULE_KINDS, RuleKind
from alerts.models import Channel, Notification, Rule
from forecasting.selectors import RunOutlook, outlooks_for, with_latest_forecasts
from tracker.models import Project, Run


def channel_list(*, project: Project) -> QuerySet[Channel]:
    return Channel.objects.filter(project=project).order_by("name", "id")


def channel_get(*, project: Project, channel_id: int) -> Channel | None:
    return Channel.objects.filter(project=project, pk=channel_id).first()


@dataclass(frozen=True)
class RuleRow:
    """A rule as the pages show it: stored, or the default a project gets on first use."""

    rule: Rule
    kind: RuleKind
    channels: list[Channel]


def _default_rule(project: Project, kind: RuleKind) -> Rule:
    # Unsaved: reading the rules page must not write them; dispatch and the first save do.
    return Rule(
        project=project,
        kind=kind.key,
        severity=kind.default_severity,
        threshold=kind.default_threshold,
    )


def rule_rows(*, project: Project) -> list[RuleRow]:
    """Every rule kind, in the order of RULE_KINDS, as stored or as its default."""
    stored = {r.kind: r for r in Rule.objects.filter(project=project).prefetch_related("channels")}
    rows = []
    for kind in RULE_KINDS:
        rule = stored.get(kind.key) or _default_rule(project, kind)
        rows.append(RuleRow(rule, kind, list(rule.channels.all()) if rule.pk else []))
    return rows


def rule_row(*, project: Project, kind: str) -> RuleRow | None:
    return next((r for r in rule_rows(project=project) if r.kind.key == kind), None)


def notification_list(*, project: Project, run: Run | None = None) -> QuerySet[Notification]:
    # By run, not channel: rows without a channel (nothing configured) are history too.
    qs = Notification.objects.select_related("channel", "run", "flag").filter(run__project=project)
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
