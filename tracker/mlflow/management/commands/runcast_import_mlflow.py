"""`manage.py runcast_import_mlflow --tracking-uri URI --project SLUG [--experiment NAME]...
[--since WHEN]`: copy an MLflow server's runs into a Runcast project. Safe to rerun: a second
run copies only what is new, and an interrupted one resumes (see tracker.mlflow.importer)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tracker.mlflow.errors import MlflowError
from tracker.mlflow.importer import mlflow_import
from tracker.models import Project


def parse_since(text: str) -> int:
    """Epoch milliseconds from an ISO date/time (UTC unless it says otherwise)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise CommandError(
            f"--since: {text!r} is not an ISO date or time (2026-11-30T08:00)"
        ) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _redacted(uri: str) -> str:
    # A URI may carry user:password@; it is recorded on each run and printed.
    scheme, sep, rest = uri.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


class Command(BaseCommand):
    help = "Copy experiments, runs, params, tags and metric histories from an MLflow server."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--tracking-uri", required=True, help="the MLflow server, e.g. http://mlflow:5000"
        )
        parser.add_argument("--project", required=True, help="the Runcast project's slug")
        parser.add_argument(
            "--experiment",
            action="append",
            default=None,
            help="an experiment name (repeatable; default: all)",
        )
        parser.add_argument(
            "--since", default=None, help="only runs started at or after this ISO time"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from mlflow import MlflowClient
        except ImportError as exc:
            raise CommandError(
                "the import needs the mlflow package: pip install 'runcast-server[mlflow]'"
            ) from exc
        project = Project.objects.filter(slug=options["project"]).first()
        if project is None:
            raise CommandError(f"no Runcast project {options['project']!r}")
        since = parse_since(options["since"]) if options["since"] else None
        source = _redacted(options["tracking_uri"])
        client = MlflowClient(tracking_uri=options["tracking_uri"])
        tty = sys.stdout.isatty()

        def progress(done: int, total: int, what: str) -> None:
            filled = int(30 * done / total) if total else 30
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} runs  {what}"
            if tty:
                self.stdout.write(f"\r{bar[:120]:<120}", ending="")
                self.stdout.flush()
            else:
                self.stdout.write(bar)

        try:
            summary = mlflow_import(
                client=client,
                project=project,
                source=source,
                experiment_names=options["experiment"],
                since_ms=since,
                progress=progress,
            )
        except MlflowError as exc:
            raise CommandError(exc.message) from exc
        if tty:
            self.stdout.write("")
        for run_id in summary.skipped:
            self.stderr.write(f"skipped MLflow run {run_id}: a run with this id was logged here")
        self.stdout.write(summary.line(source))
