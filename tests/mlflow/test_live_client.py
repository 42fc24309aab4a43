"""A script written for MLflow, unchanged, against a live Runcast server."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from forecasting.compute import forecast_compute
from forecasting.models import Forecast
from tracker import selectors
from tracker.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def stored(run_id: str, key: str) -> Any:
    run = Run.objects.get(public_id=run_id)
    return selectors.series_load(run=run, key=key, resolve=False)


def test_it_runs_a_stock_mlflow_script_unchanged(mlflow_env: Any) -> None:
    mlflow = mlflow_env
    experiment = mlflow.set_experiment("bert-pretrain")
    with mlflow.start_run(run_name="bert-base") as parent:
        mlflow.log_params({"lr": 3e-4, "max_steps": 2000, "optimizer": "adamw"})
        mlflow.set_tags({"team": "nlp", "stage": "pretrain"})
        for step in range(100):
            mlflow.log_metrics({"loss": 4.0 / (step + 1), "lr": 3e-4}, step=step)
        mlflow.log_metric("val_loss", 1.5, step=99)
        with mlflow.start_run(run_name="eval", nested=True) as child:
            mlflow.log_metric("acc", 0.9)
    client = mlflow.MlflowClient()

    assert client.get_experiment_by_name("bert-pretrain").experiment_id == experiment.experiment_id
    assert client.get_experiment_by_name("no-such-experiment") is None
    names = {e.name for e in client.search_experiments()}
    assert names == {"Default", "bert-pretrain"}

    run = client.get_run(parent.info.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "bert-base"
    assert run.data.params == {"lr": "0.0003", "max_steps": "2000", "optimizer": "adamw"}
    assert run.data.tags["team"] == "nlp"
    assert run.data.metrics == {"loss": 4.0 / 100, "lr": 3e-4, "val_loss": 1.5}
    history = client.get_metric_history(parent.info.run_id, "loss")
    assert [m.step for m in history] == list(range(100))

    nested = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    assert [r.info.run_id for r in nested] == [child.info.run_id]
    by_param = client.search_runs(
        [experiment.experiment_id], "params.optimizer = 'adamw' AND attributes.status = 'FINISHED'"
    )
    assert [r.info.run_id for r in by_param] == [parent.info.run_id]
    newest_first = client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time DESC"]
    )
    assert [r.info.run_id for r in newest_first] == [child.info.run_id, parent.info.run_id]
    assert len(mlflow.search_runs(filter_string="metrics.loss < 0.05")) == 1

    db_run = Run.objects.get(public_id=parent.info.run_id)
    assert (db_run.status, db_run.total_steps, db_run.last_step) == ("finished", 2000, 99)
    assert db_run.config["optimizer"] == "adamw"
    assert "experiment: bert-pretrain" in db_run.tags
    assert db_run.points_count == 201


def loss_at(step: int) -> float:
    return 2.0 + 8.0 * (step + 10.0) ** -0.3


# 5,000 steps exercise every path (batches of 1,000, a NaN and an inf inside, the async client's
# merged requests); `RC_STEPS=50000` runs the 50k-step scale check, which takes minutes.
STEPS = int(os.environ.get("RC_STEPS", 5_000))


def test_it_stores_many_steps_through_log_batch_exactly_once_and_forecasts(mlflow_env: Any) -> None:
    mlflow = mlflow_env
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    mlflow.set_experiment("batch")
    run = mlflow.start_run(run_name="log-batch")
    mlflow.log_param("runcast.total_steps", 2 * STEPS)
    run_id = run.info.run_id
    pending: list[Any] = []
    t0 = 1_700_000_000_000
    for step in range(STEPS):
        value = float("nan") if step == 777 else (float("inf") if step == 778 else loss_at(step))
        pending.append(Metric("loss", value, t0 + step * 10, step))
        pending.append(Metric("lr", 3e-4, t0 + step * 10, step))
        if len(pending) >= 1000:
            client.log_batch(run_id, metrics=pending)
            pending = []
    client.log_batch(run_id, metrics=pending)

    db_run = Run.objects.get(public_id=run_id)
    forecast_compute(run_id=db_run.pk)  # what the worker runs after the debounce
    eta = Forecast.objects.filter(run=db_run, kind=Forecast.Kind.ETA).order_by("-id").first()
    assert eta is not None and eta.input_last_step == STEPS - 1
    assert eta.finish_p50 is not None
    mlflow.end_run()

    for key in ("loss", "lr"):
        series = stored(run_id, key)
        assert series.steps.size == STEPS
        assert np.array_equal(np.sort(series.steps), np.arange(STEPS))
    loss = stored(run_id, "loss")
    assert np.isnan(loss.values[loss.steps == 777]).all()
    assert np.isposinf(loss.values[loss.steps == 778]).all()
    assert loss.times[0] == pytest.approx(t0 / 1000)
    db_run.refresh_from_db()
    assert (db_run.status, db_run.points_count, db_run.total_steps) == (
        "finished",
        2 * STEPS,
        2 * STEPS,
    )
    history = client.get_metric_history(run_id, "loss")
    assert len(history) == STEPS and history[777].value != history[777].value  # NaN round-trips


# Its forecasts run in-process as the points arrive, so the finished run has one.
@pytest.mark.eager
def test_it_stores_many_log_metric_calls_in_async_mode_exactly_once(
    mlflow_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`STEPS` `log_metric` calls in the client's async mode, which merges the calls queued within
    its buffering interval into log-batch requests (without an interval it sends one request
    per call, as a synchronous log_metric does: see the smaller loop below)."""
    monkeypatch.setenv("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "1")
    mlflow = mlflow_env
    mlflow.config.enable_async_logging(True)
    with mlflow.start_run(run_name="async") as run:
        mlflow.log_param("max_steps", STEPS)
        for step in range(STEPS):
            mlflow.log_metric("loss", loss_at(step), step=step)
    series = stored(run.info.run_id, "loss")
    assert series.steps.size == STEPS
    assert np.array_equal(np.sort(series.steps), np.arange(STEPS))
    db_run = Run.objects.get(public_id=run.info.run_id)
    assert (db_run.status, db_run.points_count, db_run.total_steps) == ("finished", STEPS, STEPS)
    assert Forecast.objects.filter(run=db_run, kind=Forecast.Kind.ETA).exists()


SYNC_STEPS = 200


def test_it_stores_synchronous_log_metric_calls_exactly_once(mlflow_env: Any) -> None:
    """One request per point, so the loop is short."""
    mlflow = mlflow_env
    with mlflow.start_run(run_name="sync") as run:
        for step in range(SYNC_STEPS):
            mlflow.log_metric("loss", loss_at(step), step=step)
    series = stored(run.info.run_id, "loss")
    assert np.array_equal(np.sort(series.steps), np.arange(SYNC_STEPS))
    assert np.allclose(
        series.values[np.argsort(series.steps)], [loss_at(s) for s in range(SYNC_STEPS)]
    )
