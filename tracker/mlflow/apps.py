from __future__ import annotations

from django.apps import AppConfig


class MlflowConfig(AppConfig):
    # An app of its own so its tables and migrations stay apart from tracker's.
    name = "tracker.mlflow"
    label = "tracker_mlflow"
    verbose_name = "MLflow API"
    default_auto_field = "django.db.models.BigAutoField"
