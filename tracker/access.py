"""Who may see and change what: the one access seam of every page, API and alerts view.

Outsiders get "not found" (they learn nothing, not even that a project exists); members without
the role get "forbidden". The errors are tracker's ServiceErrors, which are also Django's Http404
and PermissionDenied, so pages answer 404/403 and the API answers its own error shape.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from tracker import selectors
from tracker.models import ApiToken, Membership, Run
from tracker.services import Forbidden, NotFound

# Viewers read; members edit deadlines, targets, tokens and alerts; owners also manage people.
RANKS = {Membership.Role.VIEWER: 0, Membership.Role.MEMBER: 1, Membership.Role.OWNER: 2}


def membership_for(
    *, user: Any, project_slug: str, need: str = Membership.Role.VIEWER
) -> Membership:
    membership = selectors.membership_get(user=user, project_slug=project_slug)
    if membership is None:
        raise NotFound("no such project", field="project")
    if RANKS[Membership.Role(membership.role)] < RANKS[Membership.Role(need)]:
        raise Forbidden(f"needs the {need} role")
    return membership


def run_for(*, user: Any, project_slug: str, run_id: str, need: str = "viewer") -> Run:
    membership = membership_for(user=user, project_slug=project_slug, need=need)
    run = selectors.run_get(project=membership.project, public_id=run_id)
    if run is None:
        raise NotFound("no such run", field="run_id")
    return run


def run_for_token(*, token: ApiToken, run_id: str) -> Run:
    # Another project's run is indistinguishable from a missing one: 404, never 403.
    run = selectors.run_get(project=token.project, public_id=run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r} in this project", field="run_id")
    return run


def can_create_projects(user: Any) -> bool:
    """Staff and superusers create projects; everyone logged in when the operator allows it
    (RUNCAST_USERS_CAN_CREATE_PROJECTS)."""
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    return bool(user.is_staff or user.is_superuser or settings.RUNCAST_USERS_CAN_CREATE_PROJECTS)


def project_create_check(*, user: Any) -> None:
    if not can_create_projects(user):
        raise Forbidden("only staff create projects on this server")
