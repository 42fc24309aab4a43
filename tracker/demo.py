"""The demo project: what `scripts/dev` creates, and how it resets only what it made itself.

A person who logs runs into the demo project (with a token of their own) must find them, with
their flags and alert history, after the next `scripts/dev`. The replay's runs are recognised
by provenance: they were created by a token the demo itself issued (named DEMO_TOKEN_NAME and
created by no user, which the token form cannot produce). Runs from before provenance was
recorded are the demo's only if their config names one of the demo's own data files.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models import Q, QuerySet

from tracker.models import ApiToken, Project, Run

DEMO_PROJECT_SLUG = "demo"
DEMO_TOKEN_NAME = "demo replay"  # noqa: S105 - a token's display name, not a secret


def is_demo(project: Project) -> bool:
    return project.slug == DEMO_PROJECT_SLUG


def demo_tokens(*, project: Project) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(project=project, name=DEMO_TOKEN_NAME, created_by__isnull=True)


def demo_runs(*, project: Project, data_files: Iterable[str] = ()) -> list[Run]:
    """The runs the demo replay created in `project` (never a run a person logged)."""
    files = set(data_files)
    made_by_demo = Q(created_by_token__in=demo_tokens(project=project))
    legacy = Q(created_by_token__isnull=True)
    runs = Run.objects.filter(Q(project=project) & (made_by_demo | legacy)).select_related(
        "created_by_token"
    )
    return [
        run
        for run in runs
        if run.created_by_token_id is not None
        or (isinstance(run.config, dict) and run.config.get("source") in files)
    ]


@transaction.atomic
def demo_runs_reset(*, project: Project, data_files: Iterable[str] = ()) -> int:
    """Delete the demo replay's own runs (with their forecasts, flags and alerts); keep the rest.

    Returns how many runs were deleted.
    """
    ids = [run.pk for run in demo_runs(project=project, data_files=data_files)]
    deleted = Run.objects.filter(pk__in=ids).delete()[1].get(Run._meta.label, 0)
    return int(deleted)
