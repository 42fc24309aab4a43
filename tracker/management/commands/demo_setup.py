"""Create (idempotently) the demo user, project, deadlines and a write token for the replay.

The demo project's runs are reset on every start.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from tracker.models import ApiToken, Deadline, Membership, Project, Run
from tracker.services import token_create

DEMO_USER = "demo"
DEMO_PASSWORD = "runcast-demo"  # noqa: S105 - a local demo login, printed to the user on purpose


class Command(BaseCommand):
    help = "Create the demo user, project and deadlines; print a fresh write token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--token-file", help="write the new token here instead of stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        user, created = User.objects.get_or_create(username=DEMO_USER)
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        project, _ = Project.objects.get_or_create(
            slug="demo",
            defaults={
                "name": "Demo: real public training logs",
                "gpu_hour_price": 2.5,
                "currency": "USD",
                "timezone": "Asia/Shanghai",
            },
        )
        Membership.objects.get_or_create(
            project=project, user=user, defaults={"role": Membership.Role.OWNER}
        )
        now = timezone.now()
        # The replay starts every demo run from scratch: clear the previous start's runs so
        # the board does not show them resumed from step 0 as a rollback.
        Run.objects.filter(project=project).delete()
        # Cutoffs relative to now so the board always shows runs racing a live deadline.
        Deadline.objects.update_or_create(
            project=project,
            slug="blind-eval",
            defaults={
                "name": "Conference blind evaluation",
                "cutoff": now + timedelta(hours=7),
                "timezone": "Asia/Shanghai",
                "buffer": timedelta(hours=2),
            },
        )
        Deadline.objects.update_or_create(
            project=project,
            slug="release",
            defaults={
                "name": "Model release",
                "cutoff": now + timedelta(days=4),
                "timezone": "America/Los_Angeles",
                "buffer": timedelta(days=1),
            },
        )
        # Each demo start replaces the previous replay token: old ones are revoked, not reused.
        ApiToken.objects.filter(
            project=project, name="demo replay", revoked_at__isnull=True
        ).update(revoked_at=now)
        token = token_create(project=project, name="demo replay", scope=ApiToken.Scope.WRITE)
        if options.get("token_file"):
            with open(options["token_file"], "w") as fh:
                fh.write(token)
        else:
            self.stdout.write(token)
