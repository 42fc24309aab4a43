"""Bringing people into a project: emailed one-time invitations, or an account whose password
the owner hands over (when no SMTP server is configured).

An invitation link carries a random token; only its SHA-256 is stored, so reading the database
gives no working link. A link works once (accepting spends it under a row lock), expires after
RUNCAST_INVITE_MAX_AGE_HOURS, and a new invitation to the same address revokes the older one.
Who may invite is the caller's decision (pages require the owner role).
"""

from __future__ import annotations

import hashlib
import secrets
import smtplib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.mail import EmailMultiAlternatives, get_connection
from django.core.validators import validate_email
from django.db import transaction
from django.template.loader import render_to_string
from django.utils import timezone

from tracker.links import absolute_url
from tracker.models import Invitation, Membership, Project
from tracker.services import Conflict, Forbidden, NotFound, ServiceError

TOKEN_BYTES = 32
SMTP_TIMEOUT_S = 15


class InvitationUnusable(NotFound):
    """The link is unknown, expired, revoked or already used (one message for all: a guesser
    learns nothing about which)."""


@dataclass(frozen=True)
class IssuedInvitation:
    invitation: Invitation
    link: str  # holds the token: shown or sent once, never stored


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def max_age() -> timedelta:
    return timedelta(hours=settings.RUNCAST_INVITE_MAX_AGE_HOURS)


def email_enabled() -> bool:
    """Can invitations go out by email (an SMTP server is configured)?"""
    return bool(settings.RUNCAST_INVITE_EMAIL)


def _user_with_email(email: str) -> Any:
    return get_user_model().objects.filter(email__iexact=email).order_by("pk").first()


def _check_role(role: str) -> None:
    if role not in Membership.Role.values:
        raise ServiceError(f"unknown role {role!r}", field="role")


def _check_email(email: str) -> str:
    email = email.strip()
    try:
        validate_email(email)
    except ValidationError as exc:
        raise ServiceError(f"{email!r} is not an email address", field="email") from exc
    return email


@transaction.atomic
def invitation_create(
    *, project: Project, email: str, role: str, invited_by: Any, now: datetime | None = None
) -> IssuedInvitation:
    now = now or timezone.now()
    email = _check_email(email)
    _check_role(role)
    if Membership.objects.filter(project=project, user__email__iexact=email).exists():
        raise Conflict(f"{email} is already a member", field="email")
    # One live link per address: a re-invite (say, the first email was lost) kills the old one.
    Invitation.objects.filter(
        project=project, email__iexact=email, accepted_at__isnull=True, revoked_at__isnull=True
    ).update(revoked_at=now)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    invitation = Invitation.objects.create(
        project=project,
        email=email,
        role=role,
        token_hash=_hash(token),
        invited_by=invited_by,
        created_at=now,
        expires_at=now + max_age(),
    )
    return IssuedInvitation(invitation, absolute_url("dashboard:invite-accept", token))


def invitation_send(*, issued: IssuedInvitation) -> None:
    """Email the link; on failure the invitation is revoked and ServiceError names the reason."""
    invitation = issued.invitation
    context = {
        "project": invitation.project.name,
        "role": invitation.role,
        "inviter": getattr(invitation.invited_by, "username", "") or "An owner",
        "link": issued.link,
        "expires_at": invitation.expires_at,
        "hours": settings.RUNCAST_INVITE_MAX_AGE_HOURS,
    }
    subject = render_to_string("tracker/email/invite_subject.txt", context).strip()
    mail = EmailMultiAlternatives(
        subject=subject,
        body=render_to_string("tracker/email/invite_body.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[invitation.email],
        connection=get_connection(timeout=SMTP_TIMEOUT_S),
    )
    mail.attach_alternative(
        render_to_string("tracker/email/invite_body.html", context), "text/html"
    )
    try:
        mail.send(fail_silently=False)
    except (smtplib.SMTPException, OSError) as exc:
        invitation_revoke(invitation=invitation)
        raise ServiceError(f"the invitation email could not be sent: {exc}", field="email") from exc


def member_invite(*, project: Project, email: str, role: str, invited_by: Any) -> Invitation:
    """Create an invitation and email its link (the link exists only in that email)."""
    if not email_enabled():
        raise ServiceError("email is not configured on this server (EMAIL_HOST)", field="email")
    issued = invitation_create(project=project, email=email, role=role, invited_by=invited_by)
    invitation_send(issued=issued)
    return issued.invitation


def invitation_revoke(*, invitation: Invitation) -> None:
    Invitation.objects.filter(
        pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True
    ).update(revoked_at=timezone.now())


def invitation_for_token(*, token: str, now: datetime | None = None) -> Invitation:
    """The pending invitation a link's token names; InvitationUnusable otherwise."""
    invitation = (
        Invitation.objects.select_related("project").filter(token_hash=_hash(token)).first()
    )
    if invitation is None or not invitation.is_pending(now or timezone.now()):
        raise InvitationUnusable("this invitation link is invalid, expired or already used")
    return invitation


def invitation_account(*, invitation: Invitation) -> Any:
    """The existing account the invitation's address belongs to, if any."""
    return _user_with_email(invitation.email)


@transaction.atomic
def invitation_accept(
    *,
    token: str,
    user: Any = None,
    username: str = "",
    password: str = "",
    now: datetime | None = None,
) -> Membership:
    """Spend the link: join as `user` (who must own the invited address), or create the
    account (`username`, `password`) when the address has none. Returns the membership."""
    now = now or timezone.now()
    invitation = (
        Invitation.objects.select_for_update()
        .select_related("project")
        .filter(token_hash=_hash(token))
        .first()
    )
    if invitation is None or not invitation.is_pending(now):
        raise InvitationUnusable("this invitation link is invalid, expired or already used")
    account = invitation_account(invitation=invitation)
    if account is None:
        account = _account_create(username=username, email=invitation.email, password=password)
    elif user is None or account.pk != user.pk:
        raise Forbidden(
            f"this invitation is for {invitation.email}: log in as {account.username} to accept"
        )
    membership, _ = Membership.objects.get_or_create(
        project=invitation.project, user=account, defaults={"role": invitation.role}
    )
    Invitation.objects.filter(pk=invitation.pk, accepted_at__isnull=True).update(
        accepted_at=now, accepted_by=account
    )
    return membership


def _account_create(*, username: str, email: str, password: str) -> Any:
    user_model = get_user_model()
    username = username.strip()
    if not username:
        raise ServiceError("choose a username", field="username")
    if user_model.objects.filter(username__iexact=username).exists():
        raise Conflict(f"the username {username!r} is taken", field="username")
    user = user_model(username=username, email=email)
    try:
        user.full_clean(exclude=["password"])
        validate_password(password, user)
    except ValidationError as exc:
        field = "password" if not hasattr(exc, "error_dict") else next(iter(exc.error_dict))
        raise ServiceError(" ".join(exc.messages), field=field) from exc
    user.set_password(password)
    user.save()
    return user


@dataclass(frozen=True)
class CreatedAccount:
    membership: Membership
    password: str  # shown to the owner once, never stored in clear


@transaction.atomic
def member_create_with_password(
    *, project: Project, username: str, email: str, role: str
) -> CreatedAccount:
    """Without SMTP: create the account with a generated password for the owner to hand over
    (the person changes it at /account/password/)."""
    _check_role(role)
    email = _check_email(email) if email.strip() else ""
    if email and _user_with_email(email) is not None:
        raise Conflict(f"{email} already has an account: add it by username", field="email")
    password = secrets.token_urlsafe(12)
    user = _account_create(username=username, email=email, password=password)
    membership = Membership.objects.create(project=project, user=user, role=role)
    return CreatedAccount(membership, password)


def pending_invitations(*, project: Project, now: datetime | None = None) -> list[Invitation]:
    now = now or timezone.now()
    rows = Invitation.objects.filter(
        project=project, accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=now
    ).select_related("invited_by")
    return list(rows.order_by("email"))


def invitation_get(*, project: Project, invitation_id: int) -> Invitation | None:
    return Invitation.objects.filter(project=project, pk=invitation_id).first()
