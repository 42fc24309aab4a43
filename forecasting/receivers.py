"""Enqueue forecasting work when tracker commits new data. Only enqueues; never computes."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

# Cheap: forecasting.tasks imports the forecasting stack (scipy, pandas) only inside its tasks,
# so a web worker that only enqueues never loads it (see forecasting/tasks.py).
from forecasting.tasks import forecast_enqueue
from tracker.signals import run_finished, run_ingested


@receiver(run_ingested)
def _on_ingested(sender: Any, run_id: int, **kwargs: Any) -> None:
    forecast_enqueue(run_id=run_id)


@receiver(run_finished)
def _on_finished(sender: Any, run_id: int, **kwargs: Any) -> None:
    forecast_enqueue(run_id=run_id, immediate=True)
