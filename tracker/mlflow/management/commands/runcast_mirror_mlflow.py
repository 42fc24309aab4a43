"""`manage.py runcast_mirror_mlflow --project SLUG [--url URL] [--experiment NAME]
[--username USER] [--token-stdin | --clear-token] [--disable | --enable] [--sync]`: set up,
change or pause a project's live mirror of an MLflow server (tracker.mlflow.mirror), or show it.

The token is read from standard input (`--token-stdin`), never from an argument, which other
users of the machine could read in the process list. The command is the operator's: the URL may
be a private address (an MLflow server on the same network), which the page allows only to a
Runcast administrator.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tracker.mlflow import mirror as mirror_services
from tracker.mlflow.models import Mirror
from tracker.models import Project


def describe(mirror: Mirror) -> str:
    state = "enabled" if mirror.enabled else "paused"
    token = mirror.token_hint or "none"
    if mirror.token and mirror.username:
        token += f" (basic auth as {mirror.username})"
    experiment = mirror.experiment_name or "all experiments"
    last = (
        f"last sync {mirror.last_sync_at:%Y-%m-%d %H:%M:%S} UTC"
        if mirror.last_sync_at
        else "not synced yet"
    )
    error = f"; last error: {mirror.last_error}" if mirror.last_error else ""
    return (
        f"Mirror of {mirror.url} into {mirror.project.slug} ({experiment}), {state}, token "
        f"{token}; {last}; {mirror.runs_created} runs and {mirror.points_copied:,} points "
        f"copied{error}"
    )


class Command(BaseCommand):
    help = "Set up, change, pause or show a project's live mirror of an MLflow server."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", required=True, help="the Runcast project's slug")
        parser.add_argument("--url", help="the MLflow tracking server, e.g. http://mlflow:5000")
        parser.add_argument("--experiment", help="one experiment's name (default: all)")
        parser.add_argument(
            "--username",
            help="for MLflow's basic auth (the token is then the password; '' for a bearer token)",
        )
        token = parser.add_mutually_exclusive_group()
        token.add_argument(
            "--token-stdin",
            action="store_true",
            help="read a bearer token for the MLflow server from the first line of stdin",
        )
        token.add_argument("--clear-token", action="store_true", help="remove the stored token")
        state = parser.add_mutually_exclusive_group()
        state.add_argument("--disable", action="store_true", help="pause the mirror")
        state.add_argument("--enable", action="store_true", help="resume a paused mirror")
        parser.add_argument(
            "--sync", action="store_true", help="sync once now and print what was copied"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        project = Project.objects.filter(slug=options["project"]).first()
        if project is None:
            raise CommandError(f"no Runcast project {options['project']!r}")
        mirror = Mirror.objects.filter(project=project).first()
        changes = any(
            options[k]
            for k in (
                "url",
                "experiment",
                "username",
                "token_stdin",
                "clear_token",
                "disable",
                "enable",
            )
        ) or "" in (options["experiment"], options["username"])
        if changes:
            mirror = self._configure(project, mirror, options)
            self.stdout.write(f"Saved. {describe(mirror)}")
        elif mirror is None:
            raise CommandError(f"project {project.slug!r} mirrors no MLflow server (give --url)")
        if options["sync"]:
            assert mirror is not None
            if not mirror.enabled:
                raise CommandError("the mirror is paused (--enable)")
            summary = mirror_services.mirror_sync_one(mirror_id=mirror.pk)
            mirror.refresh_from_db()
            if summary is None and mirror.lease_until is not None:
                raise CommandError("a sync of this mirror is running now; try again shortly")
            if summary is None:
                raise CommandError(f"the sync failed: {mirror.last_error}")
            self.stdout.write(summary.line(mirror.url))
        elif not changes:
            assert mirror is not None
            self.stdout.write(describe(mirror))

    def _configure(self, project: Project, mirror: Mirror | None, options: Any) -> Mirror:
        url = options["url"] or (mirror.url if mirror else "")
        if not url:
            raise CommandError("--url is required to set up a mirror")
        token: str | None = None
        if options["token_stdin"]:
            token = sys.stdin.readline().strip()
            if not token:
                raise CommandError("--token-stdin: standard input had no token")
        elif options["clear_token"]:
            token = ""
        if options["experiment"] is not None:
            experiment = options["experiment"]
        else:
            experiment = mirror.experiment_name if mirror else ""
        enabled = not options["disable"] and (options["enable"] or mirror is None or mirror.enabled)
        try:
            return mirror_services.mirror_configure(
                project=project,
                url=url,
                experiment_name=experiment,
                token=token,
                username=options["username"],
                enabled=enabled,
                operator=True,
            )
        except mirror_services.MirrorConfigError as exc:
            raise CommandError(f"--{exc.field or 'url'}: {exc.message}") from exc
