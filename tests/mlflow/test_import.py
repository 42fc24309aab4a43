"""`runcast_import_mlflow` against a real `mlflow server` (conftest.py `mlflow_server`)."""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command

from tracker import selectors
from tracker.mlflow.importer import mlflow_import
from tracker.mlflow.models import Experiment
from tracker.models import Project, Run

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _log(client: Any, run_id: str, key: str, steps: range, t0: int) -> None:
    from mlflow.entities import Metric

    metrics = [Metric(key, 1.0 / (s + 1), t0 + s, s) for s in steps]
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])


def _stored(run_id: str, key: str) -> Any:
    return selectors.series_load(run=Run.objects.get(public_id=run_id), key=key, resolve=False)


def _import(url: str) -> str:
    out = io.StringIO()
    call_command("runcast_import_mlflow", tracking_uri=url, project="ml", stdout=out)
    return out.getvalue()


def test_it_copies_a_server_exactly_once_then_only_what_is_new(
    mlflow_server: str, ml_project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    for name in [k for k in os.environ if k.startswith("MLFLOW_")]:
        monkeypatch.delenv(name)
    source = MlflowClient(tracking_uri=mlflow_server)
    exp_id = source.create_experiment("vision", tags={"team": "cv"})
    t0 = 1_760_000_000_000
    done = source.create_run(exp_id, run_name="resnet", tags={"stage": "pretrain"})
    source.log_param(done.info.run_id, "max_steps", "5000")
    _log(source, done.info.run_id, "loss", range(5000), t0)
    _log(source, done.info.run_id, "acc", range(0, 5000, 100), t0)
    source.log_metric(done.info.run_id, "loss", float("nan"), timestamp=t0 + 9999, step=5000)
    source.set_terminated(done.info.run_id, "FINISHED")
    live = source.create_run(exp_id, run_name="vit")
    _log(source, live.info.run_id, "loss", range(1000), t0)
    default = source.create_run("0", run_name="smoke")
    source.log_metric(default.info.run_id, "loss", 3.0, step=0)

    first = _import(mlflow_server)
    assert "3 runs (3 new)" in first and "6,052 points copied" in first, first
    assert _stored(done.info.run_id, "loss").steps.size == 5001
    assert np.isnan(_stored(done.info.run_id, "loss").values[-1])
    assert _stored(done.info.run_id, "acc").steps.size == 50
    copied = Run.objects.get(public_id=done.info.run_id)
    assert (copied.status, copied.total_steps, copied.name) == ("finished", 5000, "resnet")
    assert copied.config == {"max_steps": "5000"}
    assert copied.mlflow.tags["stage"] == "pretrain"
    assert Experiment.objects.get(project=ml_project, name="vision").tags == {"team": "cv"}
    assert Run.objects.get(public_id=default.info.run_id).mlflow.experiment.public_id == "0"

    again = _import(mlflow_server)
    assert "0 new" in again and " 0 points copied (6,052 already here)" in again, again

    _log(source, live.info.run_id, "loss", range(1000, 1500), t0)
    third = _import(mlflow_server)
    assert " 500 points copied" in third, third
    steps = _stored(live.info.run_id, "loss").steps
    assert np.array_equal(np.sort(steps), np.arange(1500))
    assert Run.objects.get(public_id=live.info.run_id).points_count == 1500


def test_an_interrupted_import_resumes(
    mlflow_server: str, ml_project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from tracker.mlflow import importer

    for name in [k for k in os.environ if k.startswith("MLFLOW_")]:
        monkeypatch.delenv(name)
    # Smaller batches than the 10,000 the importer uses keep the copy short; the resume logic
    # is the same at any batch size.
    monkeypatch.setattr(importer, "BATCH_POINTS", 1000)
    source = MlflowClient(tracking_uri=mlflow_server)
    exp_id = source.create_experiment("long-run")
    run = source.create_run(exp_id)
    _log(source, run.info.run_id, "loss", range(2500), 1_760_000_000_000)

    def stop_after_first_batch(done: int, total: int, what: str) -> None:
        if "1,000/2,500" in what:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mlflow_import(
            client=source,
            project=ml_project,
            source=mlflow_server,
            experiment_names=["long-run"],
            progress=stop_after_first_batch,
        )
    assert _stored(run.info.run_id, "loss").steps.size == 1000
    summary = mlflow_import(
        client=source, project=ml_project, source=mlflow_server, experiment_names=["long-run"]
    )
    assert (summary.points_copied, summary.points_present) == (1500, 1000)
    assert np.array_equal(np.sort(_stored(run.info.run_id, "loss").steps), np.arange(2500))
