"""The first run of a team install: the administrator account, and where to log in.

    manage.py runcast_bootstrap --admin alice --email alice@example.com [--project llm]

Idempotent. The first time it creates a superuser with a generated password and prints it
once with the login URL; later runs change nothing (an existing account keeps its password)
unless --reset-password is given. `--project` also creates a project owned by the admin.
Everything after that (projects, people, tokens) is done in the web UI.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.urls import reverse
from django.utils.text import slugify

from tracker.models import Membership, Project
from tracker.project_settings.services import project_create
from tracker.services import ServiceError


class Command(BaseCommand):
    help = "Create the first administrator (idempotent) and print how to log in."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--admin", required=True, help="the administrator's username")
        parser.add_argument("--email", default="", help="the administrator's email address")
        parser.add_argument(
            "--reset-password",
            action="store_true",
            help="issue a new generated password for an existing account",
        )
        parser.add_argument("--project", default="", help="also create this project (a slug)")
        parser.add_argument("--project-name", default="", help="its name (default: the slug)")

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            user, password = self._admin(options)
            project = self._project(user, options) if options["project"] else None
        login = settings.SITE_URL.rstrip("/") + reverse("login")
        self.stdout.write(f"Log in at:  {login}")
        self.stdout.write(f"Username:   {user.username}")
        if password:
            self.stdout.write(f"Password:   {password}")
            self.stdout.write(
                "This password is shown only now. Change it after logging in: "
                + settings.SITE_URL.rstrip("/")
                + reverse("password_change")
            )
        else:
            self.stdout.write("Password:   unchanged (use --reset-password for a new one)")
        if project is not None:
            self.stdout.write(
                "Project:    "
                + settings.SITE_URL.rstrip("/")
                + reverse("dashboard:settings", args=[project.slug])
            )

    def _admin(self, options: dict[str, Any]) -> tuple[Any, str]:
        users = get_user_model()
        username = options["admin"].strip()
        if not username:
            raise CommandError("--admin needs a username")
        user = users.objects.filter(username=username).first()
        password = ""
        if user is None:
            user = users(username=username, email=options["email"])
            password = secrets.token_urlsafe(12)
        elif options["reset_password"]:
            password = secrets.token_urlsafe(12)
        if options["email"] and not user.email:
            user.email = options["email"]
        if password:
            user.set_password(password)
        user.is_staff = user.is_superuser = user.is_active = True
        user.save()
        return user, password

    def _project(self, user: Any, options: dict[str, Any]) -> Project:
        slug = slugify(options["project"])
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            try:
                return project_create(creator=user, name=options["project_name"] or slug, slug=slug)
            except ServiceError as exc:
                raise CommandError(f"--project: {exc.message}") from exc
        Membership.objects.get_or_create(
            project=project, user=user, defaults={"role": Membership.Role.OWNER}
        )
        return project
