"""Add the channels configured by RUNCAST_ALERT_EMAIL / RUNCAST_SLACK_WEBHOOK_URL to a project.

Rules create these on a project's first dispatch; this covers a project that existed before the
variables were set (the demo project across restarts).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from alerts.services import channels_ensure_from_env
from tracker.models import Project


class Command(BaseCommand):
    help = "Create the environment-configured alert channels of a project (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("project", help="project slug")

    def handle(self, *args: Any, **options: Any) -> None:
        project = Project.objects.filter(slug=options["project"]).first()
        if project is None:
            raise CommandError(f"no project {options['project']!r}")
        for channel in channels_ensure_from_env(project=project):
            self.stdout.write(f"added {channel.kind} channel {channel.name!r}")
