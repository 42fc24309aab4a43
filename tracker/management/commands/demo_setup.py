"""Create (idempotently) the demo user, project, deadlines and a write token for the replay.

Every start resets the runs the demo replay made, and only those: a run a person logged into
the demo project with a token of their own survives with its flags and alert history.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from tracker.demo import DEMO_PROJECT_SLUG, DEMO_TOKEN_NAME, demo_runs_reset, demo_tokens
from tracker.models import ApiToken, Deadline, Membership, Project
from tracker.services import token_create

DEMO_USER = "demo"
DEMO_PASSWORD = "runcast-demo"  # noqa: S105 - a local demo login, printed to the user on purpose


class Command(BaseCommand):
    help = "Create the demo user, project and deadlines; print a fresh write token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--token-file", help="write the new token here instead of stdout")
        parser.add_argument(
            "--data-dir",
            default=str(Path(settings.BASE_DIR) / "demo" / "data"),
            help="the replay's data files (runs naming one of them predate provenance)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user, created = User.objects.get_or_create(username=DEMO_USER)
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        project, _ = Project.objects.get_or_create(
            slug=DEMO_PROJECT_SLUG,
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
        # the board does not show them resumed from step 0 as a rollback. Only the replay's:
        # runs people logged here with their own tokens are theirs.
        data_files = [p.name for p in Path(options["data_dir"]).glob("*.csv")]
        removed = demo_runs_reset(project=project, data_files=data_files)
        if removed:
            self.stderr.write(f"demo: reset {removed} run(s) of the previous replay")
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
        demo_tokens(project=project).filter(revoked_at__isnull=True).update(revoked_at=now)
        token = token_create(project=project, name=DEMO_TOKEN_NAME, scope=ApiToken.Scope.WRITE)
        if options.get("token_file"):
            with open(options["token_file"], "w") as fh:
                fh.write(token)
        else:
            self.stdout.write(token)
