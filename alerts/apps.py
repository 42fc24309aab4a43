from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Subscribe to run endings, flag writes and new notifications; receivers only enqueue.
        from alerts import receivers  # noqa: F401
