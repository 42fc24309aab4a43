"""A team starts without a shell: projects created in the UI, people invited by a real email
(a local SMTP server) with a one-time link, or given an account with a password shown once."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from tracker import invitations
from tracker.models import Invitation, Membership, Project

pytestmark = pytest.mark.django_db

INVITE = "/projects/llm/settings/invitations/"
ACCOUNTS = "/projects/llm/settings/accounts/"


@pytest.fixture
def smtp(mailbox: Any, settings: Any) -> Any:
    settings.RUNCAST_INVITE_EMAIL = True
    return mailbox


def link_in(mailbox: Any) -> str:
    (message,) = mailbox.messages
    text, html = mailbox.bodies(message)
    (link,) = re.findall(r"http://testserver(/invite/[^/\s]+/)", text)
    assert link in html
    return link


# --- projects ------------------------------------------------------------------------------


def test_it_lets_staff_create_a_project_they_then_own(client: Client, outsider: User) -> None:
    outsider.is_staff = True
    outsider.save()
    client.force_login(outsider)
    assert 'id="new-project"' in client.get("/").content.decode()
    data = {"name": "Vision models", "slug": "", "timezone": "Europe/Berlin", "currency": "eur"}
    res = client.post("/projects/new/", data)
    assert res.status_code == 302 and res["Location"] == "/projects/vision-models/settings/"
    project = Project.objects.get(slug="vision-models")
    assert (project.timezone, project.currency) == ("Europe/Berlin", "EUR")
    assert project.memberships.get().user == outsider
    assert project.memberships.get().role == Membership.Role.OWNER
    assert client.get(res["Location"]).status_code == 200


def test_it_refuses_project_creation_to_plain_users_unless_the_operator_allows_it(
    client: Client, outsider: User, settings: Any
) -> None:
    client.force_login(outsider)
    assert 'id="new-project"' not in client.get("/").content.decode()
    assert client.get("/projects/new/").status_code == 403
    assert client.post("/projects/new/", {"name": "x", "timezone": "UTC"}).status_code == 403
    assert not Project.objects.filter(slug="x").exists()
    settings.RUNCAST_USERS_CAN_CREATE_PROJECTS = True
    data = {"name": "x", "timezone": "UTC", "currency": "USD"}
    assert client.post("/projects/new/", data).status_code == 302
    assert Project.objects.get(slug="x").memberships.get().user == outsider


def test_it_names_the_slug_that_is_taken(client: Client, project: Project, owner: User) -> None:
    owner.is_superuser = True
    owner.save()
    client.force_login(owner)
    res = client.post(
        "/projects/new/", {"name": "Other", "slug": "llm", "timezone": "UTC", "currency": "USD"}
    )
    assert res.status_code == 400 and "already exists" in res.content.decode()
    assert Project.objects.filter(slug="llm").get().name == "LLM pretraining"


def test_anonymous_users_are_sent_to_log_in_to_create_a_project(client: Client) -> None:
    assert client.get("/projects/new/")["Location"].startswith("/login/")


# --- invitations by email ------------------------------------------------------------------


def test_an_emailed_invitation_takes_a_new_person_to_a_logged_in_member(
    client: Client, owner: User, project: Project, smtp: Any
) -> None:
    client.force_login(owner)
    res = client.post(INVITE, {"email": "newcomer@example.com", "role": "member"})
    assert res.status_code == 201, res.content.decode()
    assert "Invitation emailed to <b>newcomer@example.com</b>" in res.content.decode()
    (message,) = smtp.messages
    assert message["To"] == "newcomer@example.com"
    assert "LLM pretraining" in message["Subject"]
    link = link_in(smtp)
    token = link.split("/")[2]
    stored = Invitation.objects.get()
    assert stored.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in str(list(Invitation.objects.values_list()))

    newcomer = Client()
    page = newcomer.get(link)
    assert page.status_code == 200 and page["Referrer-Policy"] == "same-origin"
    assert "Join LLM pretraining" in page.content.decode()
    pw = "a-long-passphrase-42"
    res = newcomer.post(link, {"username": "newcomer", "password": pw, "password_again": pw})
    assert res.status_code == 302 and res["Location"] == "/projects/llm/settings/"

    user = User.objects.get(username="newcomer")
    assert user.email == "newcomer@example.com" and user.check_password(pw)
    assert Membership.objects.get(project=project, user=user).role == Membership.Role.MEMBER
    settings_page = newcomer.get("/projects/llm/settings/").content.decode()
    assert "your role: <b>member</b>" in settings_page
    assert newcomer.get("/").status_code == 200
    # Single use: the same link is spent, for anyone.
    again = Client().post(link, {"username": "other", "password": pw, "password_again": pw})
    assert again.status_code == 410 and not User.objects.filter(username="other").exists()
    assert Client().login(username="newcomer", password=pw)


def test_an_expired_or_revoked_invitation_link_is_refused(owner: User, project: Project) -> None:
    old = invitations.invitation_create(
        project=project,
        email="late@example.com",
        role="viewer",
        invited_by=owner,
        now=timezone.now() - timedelta(hours=73),
    )
    path = old.link.removeprefix("http://testserver")
    pw = "a-long-passphrase-42"
    res = Client().post(path, {"username": "late", "password": pw, "password_again": pw})
    assert res.status_code == 410 and not User.objects.filter(username="late").exists()

    fresh = invitations.invitation_create(
        project=project, email="x@example.com", role="viewer", invited_by=owner
    )
    client = Client()
    client.force_login(owner)
    url = f"/projects/llm/settings/invitations/{fresh.invitation.pk}/revoke/"
    assert client.post(url).status_code == 302
    assert Client().get(fresh.link.removeprefix("http://testserver")).status_code == 410
    assert Client().get("/invite/not-a-real-token/").status_code == 410


def test_a_reinvitation_replaces_the_older_link(owner: User, project: Project) -> None:
    first = invitations.invitation_create(
        project=project, email="a@example.com", role="viewer", invited_by=owner
    )
    second = invitations.invitation_create(
        project=project, email="A@example.com", role="member", invited_by=owner
    )
    assert Client().get(first.link.removeprefix("http://testserver")).status_code == 410
    assert Client().get(second.link.removeprefix("http://testserver")).status_code == 200


def test_an_existing_account_accepts_by_logging_in_as_itself(
    owner: User, outsider: User, member: User, project: Project
) -> None:
    issued = invitations.invitation_create(
        project=project, email="OUTSIDER@example.com", role="viewer", invited_by=owner
    )
    path = issued.link.removeprefix("http://testserver")
    anonymous = Client().get(path).content.decode()
    assert "already has an account" in anonymous and "Log in" in anonymous

    wrong = Client()
    wrong.force_login(member)
    assert wrong.post(path).status_code == 409
    assert not Membership.objects.filter(user=outsider, project=project).exists()

    right = Client()
    right.force_login(outsider)
    assert right.post(path)["Location"] == "/projects/llm/settings/"
    assert Membership.objects.get(user=outsider, project=project).role == "viewer"
    assert User.objects.filter(email__iexact="outsider@example.com").count() == 1


def test_a_new_account_needs_a_free_username_and_a_sound_password(
    owner: User, project: Project
) -> None:
    issued = invitations.invitation_create(
        project=project, email="n@example.com", role="member", invited_by=owner
    )
    path = issued.link.removeprefix("http://testserver")
    taken = Client().post(path, {"username": "member", "password": "pw", "password_again": "pw"})
    assert taken.status_code == 400 and "is taken" in taken.content.decode()
    weak = Client().post(
        path, {"username": "n", "password": "password", "password_again": "password"}
    )
    assert weak.status_code == 400 and "too common" in weak.content.decode()
    differ = Client().post(
        path, {"username": "n", "password": "x1y2z3w4v5", "password_again": "no"}
    )
    assert differ.status_code == 400 and "differ" in differ.content.decode()
    # Failed attempts do not spend the link.
    assert Client().get(path).status_code == 200


def test_only_owners_invite_and_outsiders_learn_nothing(
    client: Client,
    member: User,
    outsider: User,
    project: Project,
    other_project: Project,
    smtp: Any,
) -> None:
    client.force_login(member)
    assert client.post(INVITE, {"email": "x@example.com", "role": "owner"}).status_code == 403
    assert client.post(ACCOUNTS, {"username": "x", "role": "owner"}).status_code == 403
    client.force_login(outsider)
    assert client.post(INVITE, {"email": "x@example.com", "role": "owner"}).status_code == 404
    assert client.post("/projects/llm/settings/invitations/1/revoke/").status_code == 404
    assert not smtp.messages and not Invitation.objects.exists()


def test_an_smtp_failure_is_shown_and_leaves_no_live_link(
    client: Client, owner: User, project: Project, smtp: Any, settings: Any
) -> None:
    settings.EMAIL_PORT = 1  # nothing listens there
    client.force_login(owner)
    res = client.post(INVITE, {"email": "newcomer@example.com", "role": "member"})
    assert res.status_code == 400 and "could not be sent" in res.content.decode()
    assert Invitation.objects.get().revoked_at is not None


def test_an_invitation_to_a_member_is_refused(
    client: Client, owner: User, project: Project, smtp: Any
) -> None:
    client.force_login(owner)
    res = client.post(INVITE, {"email": "member@example.com", "role": "viewer"})
    assert res.status_code == 400 and "already a member" in res.content.decode()
    assert not smtp.messages


# --- without SMTP: an account with a password shown once -------------------------------------


def test_without_smtp_an_owner_creates_an_account_with_a_password_shown_once(
    client: Client, owner: User, project: Project
) -> None:
    client.force_login(owner)
    page = client.get("/projects/llm/settings/").content.decode()
    assert "Email is not configured" in page and 'id="invite-form"' not in page
    assert client.post(INVITE, {"email": "a@example.com", "role": "member"}).status_code == 400

    res = client.post(ACCOUNTS, {"username": "bob", "email": "bob@example.com", "role": "viewer"})
    assert res.status_code == 201 and res["Cache-Control"] == "no-store"
    password = res.content.decode().split('id="new-account-password">')[1].split("<")[0]
    assert len(password) >= 12
    assert password not in client.get("/projects/llm/settings/").content.decode()
    bob = Client()
    assert bob.login(username="bob", password=password)
    assert Membership.objects.get(user__username="bob", project=project).role == "viewer"
    # They replace it with their own.
    new = "bobs-own-passphrase-7"
    res = bob.post(
        "/account/password/",
        {"old_password": password, "new_password1": new, "new_password2": new},
    )
    assert res.status_code == 302
    assert User.objects.get(username="bob").check_password(new)


def test_an_account_is_not_created_twice(client: Client, owner: User, project: Project) -> None:
    client.force_login(owner)
    res = client.post(ACCOUNTS, {"username": "x", "email": "member@example.com", "role": "viewer"})
    assert res.status_code == 400 and "already has an account" in res.content.decode()
    res = client.post(ACCOUNTS, {"username": "Member", "email": "", "role": "viewer"})
    assert res.status_code == 400 and "is taken" in res.content.decode()


# --- roles -----------------------------------------------------------------------------------


def test_owners_change_roles_and_remove_members_but_never_the_last_owner(
    client: Client, owner: User, member: User, project: Project
) -> None:
    client.force_login(owner)
    mine = Membership.objects.get(user=owner, project=project)
    theirs = Membership.objects.get(user=member, project=project)
    url = "/projects/llm/settings/members/{}/"
    assert client.post(url.format(mine.pk), {"role": "member"}).status_code == 409
    assert client.post(url.format(mine.pk), {"remove": "1"}).status_code == 409
    assert client.post(url.format(theirs.pk), {"role": "owner"}).status_code == 302
    assert client.post(url.format(mine.pk), {"role": "viewer"}).status_code == 302
    assert Membership.objects.get(pk=theirs.pk).role == "owner"
    other = Client()
    other.force_login(member)
    assert other.post(url.format(mine.pk), {"remove": "1"}).status_code == 302
    assert not Membership.objects.filter(pk=mine.pk).exists()


def test_the_demo_projects_token_panel_steers_real_work_elsewhere(
    client: Client, owner: User
) -> None:
    demo = Project.objects.create(slug="demo", name="Demo")
    Membership.objects.create(project=demo, user=owner, role="owner")
    client.force_login(owner)
    page = client.get("/projects/demo/settings/").content.decode()
    assert 'id="demo-notice"' in page and "runs logged with your own tokens are kept" in page
    normal = Project.objects.create(slug="real", name="Real")
    Membership.objects.create(project=normal, user=owner, role="owner")
    assert 'id="demo-notice"' not in client.get("/projects/real/settings/").content.decode()


def test_the_settings_page_queries_stay_bounded_with_invitations(
    client: Client, owner: User, project: Project, django_assert_max_num_queries: Any
) -> None:
    for n in range(5):
        invitations.invitation_create(
            project=project, email=f"p{n}@example.com", role="viewer", invited_by=owner
        )
    client.force_login(owner)
    client.get("/projects/llm/settings/")
    with django_assert_max_num_queries(9):
        page = client.get("/projects/llm/settings/").content.decode()
    assert page.count("@example.com</td><td>viewer") == 5
