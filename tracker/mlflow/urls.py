"""MLflow's REST paths. `ajax-api` is the prefix MLflow's own web UI and some clients use."""

from __future__ import annotations

from django.urls import re_path

from tracker.mlflow import artifact_views, views

urlpatterns = [
    re_path(r"^(?:ajax-)?api/2\.0/mlflow/(?P<path>.*)$", views.endpoint, name="mlflow-api"),
    re_path(
        r"^(?:ajax-)?api/2\.0/mlflow-artifacts/(?P<path>.*)$",
        artifact_views.artifact_proxy,
        name="mlflow-artifacts",
    ),
]
