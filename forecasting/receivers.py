"""Enqueue forecasting work when tracker commits new data. Only enqueues; never computes."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

# Imported here, at app start, not lazily in the receivers: the tasks pull in the services and
# with them scipy and pandas (about a second), which would otherwise stall the first batch each
# web worker receives.
from forecasting.tasks import forecast_enqueue
from tracker.signals import run_finished, run_ingested


@receiver(run_ingested)
def _on_ingested(sender: Any, run_id: int, **kwargs: Any) -> None:
    forecast_enqueue(run_id=run_id)


@receiver(run_finished)
def _on_finished(sender: Any, run_id: int, **kwargs: Any) -> None:
    forecast_enqueue(run_id=run_id, immediate=True)
