"""Who may see and change what. Outsiders get 404 (they learn nothing, not even that a project
exists); members without the role get 403."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from tracker import selectors
from tracker.models import Membership, Run

# Viewers read; members edit deadlines, targets and tokens; owners also manage people and price.
RANKS = {Membership.Role.VIEWER: 0, Membership.Role.MEMBER: 1, Membership.Role.OWNER: 2}


def membership_for(request: HttpRequest, project: str, *, need: str = "viewer") -> Membership:
    membership = selectors.membership_get(user=request.user, project_slug=project)
    if membership is None:
        raise Http404("no such project")
    if RANKS[Membership.Role(membership.role)] < RANKS[Membership.Role(need)]:
        raise PermissionDenied(f"needs the {need} role")
    return membership


def run_for(request: HttpRequest, project: str, run_id: str) -> Run:
    membership = membership_for(request, project)
    run = selectors.run_get(project=membership.project, public_id=run_id)
    if run is None:
        raise Http404("no such run")
    return run
