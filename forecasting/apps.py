from __future__ import annotations

from django.apps import AppConfig


class ForecastingConfig(AppConfig):
    name = "forecasting"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Subscribe to tracker's write-path signals (tracker never imports forecasting).
        from forecasting import receivers  # noqa: F401
