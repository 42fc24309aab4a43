"""`manage.py runcast_bootstrap`: the first administrator of a team install, idempotently."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from tracker.models import Membership, Project

pytestmark = pytest.mark.django_db


def bootstrap(*args: str) -> str:
    out = io.StringIO()
    call_command("runcast_bootstrap", *args, stdout=out)
    return out.getvalue()


def printed_password(output: str) -> str:
    (password,) = re.findall(r"^Password:\s+(\S+)$", output, flags=re.M)
    return password


def test_it_creates_an_administrator_who_can_log_in(client: Client) -> None:
    out = bootstrap("--admin", "alice", "--email", "alice@example.com")
    assert "Log in at:  http://testserver/login/" in out
    password = printed_password(out)
    user = User.objects.get(username="alice")
    assert user.is_superuser and user.is_staff and user.email == "alice@example.com"
    assert client.login(username="alice", password=password)
    assert client.get("/admin/").status_code == 200
    assert client.get("/projects/new/").status_code == 200


def test_it_is_idempotent_and_keeps_the_password_unless_asked(client: Client) -> None:
    first = printed_password(bootstrap("--admin", "alice"))
    again = bootstrap("--admin", "alice")
    assert "unchanged" in again and first not in again
    assert User.objects.filter(username="alice").count() == 1
    assert client.login(username="alice", password=first)
    second = printed_password(bootstrap("--admin", "alice", "--reset-password"))
    assert second != first
    assert not Client().login(username="alice", password=first)
    assert Client().login(username="alice", password=second)


def test_it_promotes_an_existing_account_without_touching_its_password() -> None:
    User.objects.create_user("bob", "bob@example.com", "bobs-own-passphrase")
    bootstrap("--admin", "bob")
    bob = User.objects.get(username="bob")
    assert bob.is_superuser and bob.check_password("bobs-own-passphrase")


def test_it_can_create_the_first_project_once() -> None:
    out = bootstrap("--admin", "alice", "--project", "LLM", "--project-name", "LLM pretraining")
    assert "Project:    http://testserver/projects/llm/settings/" in out
    bootstrap("--admin", "alice", "--project", "LLM")
    project = Project.objects.get()
    assert project.name == "LLM pretraining"
    assert project.memberships.get().role == Membership.Role.OWNER
