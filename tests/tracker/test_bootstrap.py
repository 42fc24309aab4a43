"""`manage.py runcast_bootstrap`: the first administrator of a team install, idempotently."""

from __future__ import annotations

import io
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from tracker.models import Membership, Project

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow
def test_it_prints_the_port_the_embedded_server_runs_on(tmp_path) -> None:
    # The embedded install serves on PORT (scripts/dev, docs/deployment.md's gunicorn line);
    # with SITE_URL unset the login URL printed must be on that port, not 8000.
    env = {k: v for k, v in os.environ.items() if k not in ("SITE_URL", "DATABASE_URL")}
    env.update(
        RUNCAST_VAR_DIR=str(tmp_path),
        PORT="8123",
        DJANGO_SETTINGS_MODULE="config.settings.base",
        PYTHONPATH=str(ROOT),
    )

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    manage("migrate", "-v0")
    out = manage("runcast_bootstrap", "--admin", "alice")
    assert "Log in at:  http://127.0.0.1:8123/login/" in out
    assert "http://127.0.0.1:8123/account/password/" in out


@pytest.mark.slow
def test_the_readme_says_how_to_get_an_administrator_in_the_embedded_mode(tmp_path) -> None:
    # The demo login cannot create projects; the README's command for an administrator of the
    # embedded install (scripts/dev's SQLite under var/) is run as written, and must make one.
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## An administrator.*?(?=^## )", readme, flags=re.M | re.S)
    assert section, "README.md has no section on getting an administrator"
    command = re.search(r"^\.venv/bin/python manage\.py runcast_bootstrap (.+)$", section[0], re.M)
    assert command, "the section shows no runcast_bootstrap command"
    env = {k: v for k, v in os.environ.items() if k not in ("SITE_URL", "DATABASE_URL", "PORT")}
    env.update(RUNCAST_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="config.settings.base")
    for args in (["migrate", "-v0"], ["runcast_bootstrap", *command[1].split("#")[0].split()]):
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert "Log in at:  http://127.0.0.1:8000/login/" in done.stdout
    (username,) = re.findall(r"^Username:\s+(\S+)$", done.stdout, flags=re.M)
    with sqlite3.connect(tmp_path / "runcast.sqlite3") as db:
        flags = db.execute(
            "SELECT is_staff, is_superuser FROM auth_user WHERE username = ?", (username,)
        ).fetchone()
    assert flags == (1, 1)  # staff may create projects and see the Admin link
