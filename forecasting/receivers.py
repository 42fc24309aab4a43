"""Enqueue forecasting work when tracker commits new data. Only enqueues; never computes."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from tracker.signals import run_finished, run_ingested


@receiver(run_ingested)
def _on_ingested(sender: Any, run_id: int, **kwargs: Any) -> None:
    from forecasting.services import forecast_request

    forecast_request(run_id=run_id)


@receiver(run_finished)
def _on_finished(sender: Any, run_id: int, **kwargs: Any) -> None:
    from forecasting.services import forecast_request

    forecast_request(run_id=run_id, immediate=True)
