"""Projects and people: create a project, invite by email, create an account with a password
(no SMTP), revoke an invitation, and the invitation link's own page.

The invitation page is the one page reachable without logging in: the link's token is the
credential. GET only shows it (mail scanners fetch links; that must not spend them); POST spends
it. Its responses are never cached and send a Referer only to this site, so the token does not
travel on.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.project_settings.views import render_settings
from dashboard.team import forms
from tracker import invitations
from tracker.access import membership_for, project_create_check
from tracker.models import Invitation
from tracker.project_settings import services as svc
from tracker.services import ServiceError


@login_required
@require_http_methods(["GET", "POST"])
def project_new(request: HttpRequest) -> HttpResponse:
    project_create_check(user=request.user)
    form = forms.ProjectCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            project = svc.project_create(creator=request.user, **form.cleaned_data)
            return redirect("dashboard:settings", project=project.slug)
        except ServiceError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
    status = 400 if request.method == "POST" else 200
    return render(request, "dashboard/project_new.html", {"form": form}, status=status)


@login_required
@require_POST
def member_invite(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="owner")
    form = forms.InviteForm(request.POST)
    if form.is_valid():
        try:
            invitation = invitations.member_invite(
                project=membership.project,
                email=form.cleaned_data["email"],
                role=form.cleaned_data["role"],
                invited_by=request.user,
            )
            return render_settings(request, membership, 201, invited=invitation)
        except ServiceError as exc:
            form.add_error("email", exc.message)
    return render_settings(request, membership, 400, invite_form=form)


@login_required
@require_POST
def member_create(request: HttpRequest, project: str) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="owner")
    form = forms.AccountCreateForm(request.POST)
    if form.is_valid():
        try:
            created = invitations.member_create_with_password(
                project=membership.project, **form.cleaned_data
            )
        except ServiceError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            # Rendered, not redirected: the password lives only in this response.
            response = render_settings(request, membership, 201, new_account=created)
            response["Cache-Control"] = "no-store"
            return response
    return render_settings(request, membership, 400, account_form=form)


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, project: str, invitation_id: int) -> HttpResponse:
    membership = membership_for(user=request.user, project_slug=project, need="owner")
    invitation = invitations.invitation_get(project=membership.project, invitation_id=invitation_id)
    if invitation is None:
        raise Http404("no such invitation")
    invitations.invitation_revoke(invitation=invitation)
    return redirect("dashboard:settings", project=project)


@require_http_methods(["GET", "POST"])
def invite_accept(request: HttpRequest, token: str) -> HttpResponse:
    try:
        invitation = invitations.invitation_for_token(token=token)
    except invitations.InvitationUnusable as exc:
        return _private(render(request, "dashboard/invite.html", {"gone": exc.message}, status=410))
    account = invitations.invitation_account(invitation=invitation)
    form = forms.InviteAcceptForm(
        request.POST if request.method == "POST" and account is None else None,
        initial={"username": invitation.email.split("@")[0]},
    )
    context = _accept_context(request, invitation, account, form)
    # Someone else's session must not swallow the invitation (or be swapped for a new account).
    if request.method == "POST" and not context["signed_in_as_other"]:
        accepted = _accept(request, token, account, form)
        if accepted is not None:
            return accepted
    status = 200 if request.method == "GET" else 409 if context["signed_in_as_other"] else 400
    return _private(render(request, "dashboard/invite.html", context, status=status))


def _accept(
    request: HttpRequest, token: str, account: Any, form: forms.InviteAcceptForm
) -> HttpResponse | None:
    """Spend the link; the redirect on success, None to show the page again with errors."""
    if account is None and not form.is_valid():
        return None
    user = request.user if request.user.is_authenticated else None
    try:
        membership = invitations.invitation_accept(
            token=token,
            user=user,
            username=form.cleaned_data.get("username", "") if account is None else "",
            password=form.cleaned_data.get("password", "") if account is None else "",
        )
    except invitations.InvitationUnusable as exc:
        return _private(render(request, "dashboard/invite.html", {"gone": exc.message}, status=410))
    except ServiceError as exc:
        form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        return None
    if user is None:
        # The configured backend (the throttled one): a session naming any other is not honoured.
        login(request, membership.user, backend=settings.AUTHENTICATION_BACKENDS[0])
    return redirect("dashboard:settings", project=membership.project.slug)


def _accept_context(
    request: HttpRequest, invitation: Invitation, account: Any, form: forms.InviteAcceptForm
) -> dict[str, Any]:
    user = request.user
    return {
        "invitation": invitation,
        "account": account,
        "form": form,
        "signed_in_as_other": user.is_authenticated and (account is None or account.pk != user.pk),
        "login_url": f"{reverse('login')}?next={request.path}",
    }


def _private(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"
    # same-origin, not no-referrer: with no-referrer the browser sends "Origin: null" on the
    # form's POST and Django's CSRF check refuses it. Same-origin keeps the token from leaving.
    response["Referrer-Policy"] = "same-origin"
    return response
