"""Thin Celery tasks of the MLflow API: take no model instances, call a service."""

from __future__ import annotations

from celery import shared_task

from tracker.mlflow import artifacts, mirror


@shared_task(soft_time_limit=300, time_limit=330)
def artifacts_sweep() -> None:
    """Beat: delete the files of runs, logged models and projects that are gone."""
    artifacts.artifacts_orphans_delete()


@shared_task(soft_time_limit=60, time_limit=90)
def mirrors_sync() -> None:
    """Beat: one sync task per enabled MLflow mirror (each claims its mirror, so a slow sync
    and the next tick never overlap)."""
    for mirror_id in mirror.mirror_ids_enabled():
        mirror_sync.delay(mirror_id)


@shared_task(soft_time_limit=60, time_limit=90)
def mirror_sync(mirror_id: int) -> None:
    mirror.mirror_sync_one(mirror_id=mirror_id)
