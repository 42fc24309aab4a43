"""Saved runs explorer views: a project's named query strings (tracker.models.SavedView)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.db import transaction

from tracker.models import Project, SavedView
from tracker.services import NotFound, ServiceError

NAME_MAX = 100
QUERY_MAX = 4_000
# Not part of a view: where its pages stood.
_TRANSIENT = ("after",)


def saved_view_list(*, project: Project) -> list[SavedView]:
    return list(SavedView.objects.filter(project=project).order_by("name"))


@transaction.atomic
def saved_view_save(*, project: Project, user: Any, name: str, query: str) -> SavedView:
    """Save the view under `name`, replacing the project's view of that name."""
    name = name.strip()
    if not name or len(name) > NAME_MAX:
        raise ServiceError(f"a view's name is 1 to {NAME_MAX} characters", field="name")
    kept = urlencode([(k, v) for k, v in parse_qsl(query) if k not in _TRANSIENT])
    if len(kept) > QUERY_MAX:
        raise ServiceError(f"a view is at most {QUERY_MAX} characters of query", field="query")
    view, _ = SavedView.objects.update_or_create(
        project=project, name=name, defaults={"query": kept, "created_by": user}
    )
    return view


def saved_view_delete(*, project: Project, view_id: int) -> None:
    deleted, _ = SavedView.objects.filter(project=project, pk=view_id).delete()
    if not deleted:
        raise NotFound("no such view", field="view")
