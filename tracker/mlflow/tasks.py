"""Thin Celery tasks of the MLflow API: take no model instances, call a service."""

from __future__ import annotations

from celery import shared_task

from tracker.mlflow import artifacts


@shared_task(soft_time_limit=300, time_limit=330)
def artifacts_sweep() -> None:
    """Beat: delete the files of runs, logged models and projects that are gone."""
    artifacts.artifacts_orphans_delete()
