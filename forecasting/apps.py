from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class ForecastingConfig(AppConfig):
    name = "forecasting"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Subscribe to tracker's write-path signals (tracker never imports forecasting).
        from forecasting import receivers  # noqa: F401

        if settings.CELERY_TASK_ALWAYS_EAGER:
            # Tasks run inside this process (the test settings): load their stack now, as a
            # worker does before forking, not inside the first request that enqueues one.
            from forecasting import compute, liveness  # noqa: F401
