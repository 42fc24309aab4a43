"""What a stock mlflow client meets when something is refused: MLflow's own error JSON."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from tracker import selectors
from tracker.models import ApiToken, Project, Run
from tracker.services import token_create

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_it_answers_unknown_runs_with_resource_does_not_exist(mlflow_env: Any) -> None:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as err:
        mlflow_env.MlflowClient().get_run("0123456789abcdef0123456789abcdef")
    assert err.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    assert "0123456789abcdef0123456789abcdef" in err.value.message


def test_it_refuses_a_bad_value_naming_the_field(mlflow_env: Any) -> None:
    from mlflow.exceptions import MlflowException

    mlflow = mlflow_env
    with mlflow.start_run() as run:
        mlflow.log_param("lr", "0.1")
        with pytest.raises(MlflowException) as changed:
            mlflow.log_param("lr", "0.2")
        with pytest.raises(MlflowException) as bad_name:
            mlflow.set_tag("../escape", "x")
    assert changed.value.error_code == "INVALID_PARAMETER_VALUE"
    assert "Changing param values is not allowed" in changed.value.message
    assert bad_name.value.error_code == "INVALID_PARAMETER_VALUE"
    assert Run.objects.get(public_id=run.info.run_id).config == {"lr": "0.1"}


def test_it_answers_raw_requests_in_mlflow_error_json(live_server: Any, ml_token: str) -> None:
    requests = pytest.importorskip("requests")
    auth = {"Authorization": f"Bearer {ml_token}"}
    base = f"{live_server.url}/api/2.0/mlflow"
    created = requests.post(f"{base}/runs/create", json={"experiment_id": "0"}, headers=auth)
    run_id = created.json()["run"]["info"]["run_id"]

    bad = requests.post(
        f"{base}/runs/log-metric",
        json={"run_id": run_id, "key": "loss", "value": "abc", "timestamp": 1},
        headers=auth,
    )
    assert bad.status_code == 400
    assert bad.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "'value'" in bad.json()["message"]

    in_batch = requests.post(
        f"{base}/runs/log-batch",
        json={"run_id": run_id, "metrics": [{"key": "loss", "value": 1, "timestamp": -5}]},
        headers=auth,
    )
    assert in_batch.status_code == 400 and "metrics[0].timestamp" in in_batch.json()["message"]

    too_many = [{"key": "m", "value": 1.0, "timestamp": 1, "step": i} for i in range(1001)]
    over = requests.post(
        f"{base}/runs/log-batch", json={"run_id": run_id, "metrics": too_many}, headers=auth
    )
    assert over.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "at most 1000 metrics" in over.json()["message"]

    huge = {"run_id": run_id, "tags": [{"key": "t", "value": "x" * 1_000_001}]}
    too_big = requests.post(f"{base}/runs/log-batch", json=huge, headers=auth)
    assert "at most 1000000 bytes" in too_big.json()["message"]

    for path in ("registered-models/search", "traces/search", "no/such/thing"):
        answer = requests.get(f"{base}/{path}", headers=auth)
        assert answer.headers["Content-Type"] == "application/json", path
        assert answer.json()["error_code"] in ("NOT_IMPLEMENTED", "ENDPOINT_NOT_FOUND"), path
        assert answer.json()["message"], path
    assert requests.get(f"{base}/no/such/thing", headers=auth).status_code == 404

    no_token = requests.get(f"{base}/experiments/get", params={"experiment_id": "0"})
    assert (no_token.status_code, no_token.json()["error_code"]) == (401, "UNAUTHENTICATED")
    assert Run.objects.get(public_id=run_id).points_count == 0  # nothing refused was kept


def test_a_retried_batch_is_stored_once(live_server: Any, ml_token: str) -> None:
    requests = pytest.importorskip("requests")
    auth = {"Authorization": f"Bearer {ml_token}"}
    base = f"{live_server.url}/api/2.0/mlflow"
    run_id = requests.post(f"{base}/runs/create", json={}, headers=auth).json()["run"]["info"][
        "run_id"
    ]
    now = int(time.time() * 1000)
    body = {
        "run_id": run_id,
        "metrics": [
            {"key": "loss", "value": v, "timestamp": now, "step": s}
            for s, v in enumerate([1.0, "NaN", "Infinity", "-Infinity"])
        ],
    }
    for _ in range(3):  # a client retrying after a timeout
        assert requests.post(f"{base}/runs/log-batch", json=body, headers=auth).status_code == 200
    run = Run.objects.get(public_id=run_id)
    series = selectors.series_load(run=run, key="loss", resolve=False)
    assert series.steps.tolist() == [0, 1, 2, 3]
    assert np.isnan(series.values[1]) and series.values[2] == np.inf and series.values[3] == -np.inf


def test_tokens_see_only_their_project(
    live_server: Any, ml_token: str, ml_project: Project, other_write_token: str
) -> None:
    requests = pytest.importorskip("requests")
    base = f"{live_server.url}/api/2.0/mlflow"
    mine = {"Authorization": f"Bearer {ml_token}"}
    theirs = {"Authorization": f"Bearer {other_write_token}"}
    run_id = requests.post(f"{base}/runs/create", json={}, headers=mine).json()["run"]["info"][
        "run_id"
    ]
    exp_id = requests.post(
        f"{base}/experiments/create", json={"name": "private"}, headers=mine
    ).json()["experiment_id"]
    seen = requests.get(f"{base}/runs/get", params={"run_id": run_id}, headers=theirs)
    assert (seen.status_code, seen.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    exp = requests.get(f"{base}/experiments/get", params={"experiment_id": exp_id}, headers=theirs)
    assert exp.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    found = requests.post(
        f"{base}/runs/search", json={"experiment_ids": ["0", exp_id]}, headers=theirs
    )
    assert found.json().get("runs", []) == []
    logged = requests.post(
        f"{base}/runs/log-metric",
        json={"run_id": run_id, "key": "x", "value": 1, "timestamp": 1},
        headers=theirs,
    )
    assert logged.status_code == 404
    reader = token_create(project=ml_project, name="r", scope=ApiToken.Scope.READ)
    read_only = {"Authorization": f"Bearer {reader}"}
    assert requests.get(f"{base}/runs/get", params={"run_id": run_id}, headers=read_only).ok
    refused = requests.post(
        f"{base}/runs/set-tag", json={"run_id": run_id, "key": "a", "value": "b"}, headers=read_only
    )
    assert (refused.status_code, refused.json()["error_code"]) == (403, "PERMISSION_DENIED")


def test_it_resumes_a_run_by_id_as_a_new_segment(mlflow_env: Any) -> None:
    mlflow = mlflow_env
    with mlflow.start_run() as first:
        for step in range(100):
            mlflow.log_metric("loss", 1.0, step=step)
    mlflow.end_run()
    mlflow.MlflowClient().set_terminated(first.info.run_id, status="FAILED")
    assert Run.objects.get(public_id=first.info.run_id).status == "failed"
    with mlflow.start_run(run_id=first.info.run_id):  # restarted from the checkpoint at 50
        assert Run.objects.get(public_id=first.info.run_id).status == "running"
        mlflow.log_metrics({"loss": 0.5}, step=50)
        mlflow.log_metrics({"loss": 0.4}, step=51)
    run = Run.objects.get(public_id=first.info.run_id)
    assert (run.status, run.current_segment, run.last_step) == ("finished", 2, 51)
    assert run.segments.get(number=2).lost_steps == 49
    history = mlflow.MlflowClient().get_metric_history(first.info.run_id, "loss")
    assert len(history) == 102


def test_it_stores_system_metrics(mlflow_env: Any) -> None:
    pytest.importorskip("psutil")
    mlflow = mlflow_env
    mlflow.set_system_metrics_sampling_interval(0.2)
    mlflow.set_system_metrics_samples_before_logging(1)
    mlflow.enable_system_metrics_logging()
    try:
        with mlflow.start_run() as run:
            time.sleep(2.0)
    finally:
        mlflow.set_system_metrics_sampling_interval(None)
        mlflow.set_system_metrics_samples_before_logging(None)
    keys = selectors.series_keys(run=Run.objects.get(public_id=run.info.run_id))
    assert any(k.startswith("system/cpu") for k in keys), keys
