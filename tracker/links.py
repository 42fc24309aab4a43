"""Absolute links for what leaves the server (alert messages, API responses): SITE_URL plus the
path Django's URL resolver gives, so a moved page never leaves a stale hand-built link."""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse

from tracker.models import Project, Run


def absolute_url(viewname: str, *args: object) -> str:
    return settings.SITE_URL.rstrip("/") + reverse(viewname, args=args)


def run_url(run: Run) -> str:
    return absolute_url("dashboard:run", run.project.slug, run.public_id)


def project_alerts_url(project: Project) -> str:
    return absolute_url("alerts:history", project.slug)
