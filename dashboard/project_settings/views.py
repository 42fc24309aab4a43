"""Project settings: the project (price, currency, timezone), targets, members, tokens and
deadlines. Viewers see the page read-only; every POST checks the role again (403)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.project_settings import forms
from dashboard.team.forms import AccountCreateForm, InviteForm
from tracker import invitations
from tracker.access import can_create_projects, membership_for
from tracker.demo import is_demo
from tracker.mlflow import mirror as mirror_services
from tracker.mlflow import selectors as mirror_selectors
from tracker.mlflow.models import Mirror
from tracker.models import Deadline, Membership, Project
from tracker.project_settings import selectors as sel
from tracker.project_settings import services as svc
from tracker.services import ServiceError, token_create, token_revoke


def render_settings(
    request: HttpRequest, membership: Membership, status: int = 200, **extra: Any
) -> HttpResponse:
    """The settings page, with what a handler adds (a bound form with its errors, a secret shown
    once); the team pages render it too."""
    project = membership.project
    mirror = mirror_selectors.mirror_for(project=project)
    context: dict[str, Any] = {
        "project": project,
        "membership": membership,
        "can_edit": membership.can_edit,
        "is_owner": membership.role == Membership.Role.OWNER,
        "members": sel.membership_list(project=project),
        "tokens": sel.token_list(project=project) if membership.can_edit else [],
        "deadlines": sel.deadline_list(project=project),
        "roles": Membership.Role.choices,
        "project_form": forms.ProjectForm(initial=_project_initial(project)),
        "targets_form": forms.TargetsForm(
            initial={"targets": forms.TargetsForm.initial_text(project.targets)}
        ),
        "member_form": forms.MemberAddForm(),
        "token_form": forms.TokenForm(),
        "mirror": mirror,
        "mirror_form": forms.MirrorForm(initial=_mirror_initial(mirror)),
        **_team_context(request, membership),
        **extra,
    }
    return render(request, "dashboard/settings.html", context, status=status)


def _team_context(request: HttpRequest, membership: Membership) -> dict[str, Any]:
    is_owner = membership.role == Membership.Role.OWNER
    return {
        "invitations": invitations.pending_invitations(project=membership.project)
        if is_owner
        else [],
        "invite_form": InviteForm(),
        "account_form": AccountCreateForm(),
        "email_enabled": invitations.email_enabled(),
        "is_demo": is_demo(membership.project),
        "can_create_projects": can_create_projects(request.user),
    }


def _mirror_initial(mirror: Mirror | None) -> dict[str, Any]:
    if mirror is None:
        return {"enabled": True}
    return {
        "url": mirror.url,
        "experiment_name": mirror.experiment_name,
        "username": mirror.username,
        "enabled": mirror.enabled,
    }


def _project_initial(project: Project) -> dict[str, Any]:
    return {
        "gpu_hour_price": project.gpu_hour_price,
        "currency": project.currency,
        "timezone": project.timezone,
    }


@login_required
@require_GET
def settings_page(request: HttpRequest, project: str) -> HttpResponse:
    return render_settings(request, membership_for(user=request.user, project_slug=project))


@login_required
@require_POST
def settings_project(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="owner")
    form = forms.ProjectForm(request.POST)
    if not form.is_valid():
        return render_settings(request, membership, 400, project_form=form)
    svc.project_update(project=membership.project, **form.cleaned_data)
    return redirect("dashboard:settings", project=project)


@login_required
@require_POST
def settings_targets(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="member")
    form = forms.TargetsForm(request.POST)
    if not form.is_valid():
        return render_settings(request, membership, 400, targets_form=form)
    svc.project_targets_update(project=membership.project, targets=form.cleaned_data["targets"])
    return redirect("dashboard:settings", project=project)


@login_required
@require_POST
def settings_mirror(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="owner")
    form = forms.MirrorForm(request.POST)
    if form.is_valid():
        d = form.cleaned_data
        try:
            mirror_services.mirror_configure(
                project=membership.project,
                url=d["url"],
                experiment_name=d["experiment_name"],
                token="" if d["clear_token"] else (d["token"] or None),
                username=d["username"],
                enabled=d["enabled"],
                # A Runcast administrator may point a mirror at a private address; an owner
                # who is not one gets the outbound seam's public-address rule.
                operator=request.user.is_staff,
            )
            return redirect("dashboard:settings", project=project)
        except mirror_services.MirrorConfigError as exc:
            form.add_error(exc.field or None, exc.message)
    return render_settings(request, membership, 400, mirror_form=form)


@login_required
@require_POST
def member_add(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="owner")
    form = forms.MemberAddForm(request.POST)
    if form.is_valid():
        try:
            svc.membership_add(
                project=membership.project,
                username_or_email=form.cleaned_data["user"],
                role=form.cleaned_data["role"],
            )
            return redirect("dashboard:settings", project=project)
        except ServiceError as exc:
            form.add_error("user", exc.message)
    return render_settings(request, membership, 400, member_form=form)


@login_required
@require_POST
def member_update(request: HttpRequest, project: str, membership_id: int) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="owner")
    target = sel.membership_get_by_id(project=membership.project, membership_id=membership_id)
    if target is None:
        raise Http404("no such member")
    form = forms.MemberRoleForm(request.POST)
    try:
        if not form.is_valid():
            raise ServiceError("invalid role", field="role")
        if form.cleaned_data["remove"]:
            svc.membership_remove(membership=target)
        elif form.cleaned_data["role"]:
            svc.membership_change_role(membership=target, role=form.cleaned_data["role"])
    except ServiceError as exc:
        return render_settings(request, membership, 409, member_error=exc.message)
    return redirect("dashboard:settings", project=project)


@login_required
@require_POST
def token_new(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="member")
    form = forms.TokenForm(request.POST)
    if not form.is_valid():
        return render_settings(request, membership, 400, token_form=form)
    full = token_create(
        project=membership.project,
        name=form.cleaned_data["name"],
        scope=form.cleaned_data["scope"],
        created_by=request.user,
    )
    # Rendered, not redirected: the secret lives only in this response, never in a session.
    response = render_settings(
        request, membership, 201, new_token=full, new_token_name=form.cleaned_data["name"]
    )
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def token_delete(request: HttpRequest, project: str, token_id: int) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="member")
    token = sel.token_get(project=membership.project, token_id=token_id)
    if token is None:
        raise Http404("no such token")
    token_revoke(token=token)
    return redirect("dashboard:settings", project=project)


@login_required
@require_http_methods(["GET", "POST"])
def deadline_new(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="member")
    return _deadline_form(request, membership.project, None)


@login_required
@require_http_methods(["GET", "POST"])
def deadline_edit(request: HttpRequest, project: str, slug: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="member")
    deadline = sel.deadline_get(project=membership.project, slug=slug)
    if deadline is None:
        raise Http404("no such deadline")
    return _deadline_form(request, membership.project, deadline)


def _deadline_form(
    request: HttpRequest, project: Project, deadline: Deadline | None
) -> HttpResponse:
    """Create (deadline None) or edit one deadline; both share the form and its errors."""
    initial = (
        forms.DeadlineForm.initial_for(deadline) if deadline else {"timezone": project.timezone}
    )
    form = forms.DeadlineForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        fields = {k: d[k] for k in ("name", "cutoff", "timezone", "buffer", "notes")}
        try:
            if deadline is None:
                svc.deadline_create(project=project, **fields)
            else:
                svc.deadline_update(deadline=deadline, **fields)
            return redirect("dashboard:settings", project=project.slug)
        except ServiceError as exc:
            form.add_error(None, exc.message)
    status = 400 if request.method == "POST" else 200
    context = {"project": project, "form": form, "deadline": deadline}
    return render(request, "dashboard/deadline_form.html", context, status=status)
