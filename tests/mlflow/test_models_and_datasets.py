"""MLflow 3's logged models, dataset inputs and the history endpoints MLflow's UI calls, over the
wire (Django's test client; no mlflow package needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

API = "/api/2.0/mlflow"


class Mlflow:
    def __init__(self, client: Client, token: str) -> None:
        self.client = client
        self.auth = {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, data: dict[str, Any] | None = None) -> Any:
        url = f"{API}/{path}"
        if method == "GET":
            return self.client.get(url, data or {}, headers=self.auth)
        send = getattr(self.client, method.lower())
        return send(
            url, data=json.dumps(data or {}), content_type="application/json", headers=self.auth
        )

    def ok(self, method: str, path: str, data: dict[str, Any] | None = None) -> Any:
        answer = self.call(method, path, data)
        assert answer.status_code == 200, answer.content
        return answer.json()

    def run(self) -> str:
        return str(self.ok("POST", "runs/create", {"experiment_id": "0"})["run"]["info"]["run_id"])


@pytest.fixture
def ml(client: Client, write_token: str) -> Mlflow:
    return Mlflow(client, write_token)


def test_a_logged_model_is_created_finalized_tagged_and_found(ml: Mlflow) -> None:
    run_id = ml.run()
    created = ml.ok(
        "POST",
        "logged-models",
        {
            "experiment_id": "0",
            "name": "clf",
            "source_run_id": run_id,
            "model_type": "sklearn",
            "params": [{"key": "alpha", "value": "0.1"}],
            "tags": [{"key": "mlflow.source.name", "value": "train.py"}],
        },
    )["model"]
    model_id = created["info"]["model_id"]
    assert model_id.startswith("m-")
    assert created["info"]["status"] == "LOGGED_MODEL_PENDING"
    assert created["info"]["artifact_uri"] == f"mlflow-artifacts:/0/models/{model_id}/artifacts"

    ml.ok("POST", f"logged-models/{model_id}/params", {"params": [{"key": "l1", "value": "0"}]})
    ml.ok("PATCH", f"logged-models/{model_id}/tags", {"tags": [{"key": "team", "value": "nlp"}]})
    ml.ok("DELETE", f"logged-models/{model_id}/tags/mlflow.source.name")
    missing_tag = ml.call("DELETE", f"logged-models/{model_id}/tags/nope")
    assert missing_tag.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    ready = ml.ok("PATCH", f"logged-models/{model_id}", {"model_id": model_id, "status": 2})
    assert ready["model"]["info"]["status"] == "LOGGED_MODEL_READY"
    bad = ml.call("PATCH", f"logged-models/{model_id}", {"model_id": model_id, "status": 9})
    assert bad.status_code == 400 and "status" in bad.json()["message"]

    # Metrics logged with the model's id become the model's, each point once.
    point = {"key": "acc", "value": 0.9, "timestamp": 1000, "step": 0, "model_id": model_id}
    for _ in range(2):
        ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [point]})
    got = ml.ok("GET", f"logged-models/{model_id}")["model"]
    assert {p["key"]: p["value"] for p in got["data"]["params"]} == {"alpha": "0.1", "l1": "0"}
    assert got["info"]["tags"] == [{"key": "team", "value": "nlp"}]
    assert [(m["key"], m["value"], m["run_id"]) for m in got["data"]["metrics"]] == [
        ("acc", 0.9, run_id)
    ]

    other = ml.ok("POST", "logged-models", {"experiment_id": "0"})["model"]["info"]["model_id"]
    found = ml.ok("POST", "logged-models/search", {"experiment_ids": ["0"]})["models"]
    assert [m["info"]["model_id"] for m in found] == [other, model_id]  # newest first
    by_name = ml.ok(
        "POST", "logged-models/search", {"experiment_ids": ["0"], "filter": "name = 'clf'"}
    )
    assert [m["info"]["model_id"] for m in by_name["models"]] == [model_id]
    by_param = ml.ok(
        "POST",
        "logged-models/search",
        {
            "experiment_ids": ["0"],
            "filter": "params.alpha = '0.1'",
            "order_by": [{"field_name": "name", "ascending": True}],
        },
    )
    assert [m["info"]["model_id"] for m in by_param["models"]] == [model_id]

    ml.ok("DELETE", f"logged-models/{model_id}")
    gone = ml.call("GET", f"logged-models/{model_id}")
    assert (gone.status_code, gone.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    assert ml.ok("GET", f"logged-models/{model_id}", {"allow_deleted": "true"})["model"]


def test_another_projects_token_sees_no_model_and_a_read_token_makes_none(
    ml: Mlflow, client: Client, other_write_token: str, read_token: str
) -> None:
    model_id = ml.ok("POST", "logged-models", {"experiment_id": "0"})["model"]["info"]["model_id"]
    theirs = Mlflow(client, other_write_token)
    assert theirs.call("GET", f"logged-models/{model_id}").status_code == 404
    assert theirs.call("PATCH", f"logged-models/{model_id}", {"status": 2}).status_code == 404
    assert theirs.ok("POST", "logged-models/search", {"experiment_ids": ["0"]}) == {"models": []}
    reader = Mlflow(client, read_token)
    assert reader.call("GET", f"logged-models/{model_id}").status_code == 200
    refused = reader.call("POST", "logged-models", {"experiment_id": "0"})
    assert (refused.status_code, refused.json()["error_code"]) == (403, "PERMISSION_DENIED")


def test_the_model_registry_is_refused_clearly(ml: Mlflow) -> None:
    answer = ml.call("POST", "registered-models/create", {"name": "clf"})
    assert (answer.status_code, answer.json()["error_code"]) == (501, "NOT_IMPLEMENTED")
    assert "registry" in answer.json()["message"] and "log_model" in answer.json()["message"]


def test_dataset_inputs_are_kept_shown_and_searchable(ml: Mlflow) -> None:
    run_id = ml.run()
    dataset = {
        "name": "train",
        "digest": "abc123",
        "source_type": "local",
        "source": '{"uri": "/data/train.csv"}',
    }
    item = {"tags": [{"key": "mlflow.data.context", "value": "training"}], "dataset": dataset}
    for _ in range(2):  # logged twice: kept once
        ml.ok("POST", "runs/log-inputs", {"run_id": run_id, "datasets": [item]})
    run = ml.ok("GET", "runs/get", {"run_id": run_id})["run"]
    assert run["inputs"] == {"dataset_inputs": [item]}
    summaries = ml.ok("POST", "experiments/search-datasets", {"experiment_ids": ["0"]})
    assert summaries == {
        "dataset_summaries": [
            {"experiment_id": "0", "name": "train", "digest": "abc123", "context": "training"}
        ]
    }
    no_digest = {"dataset": {**dataset, "digest": ""}}
    refused = ml.call("POST", "runs/log-inputs", {"run_id": run_id, "datasets": [no_digest]})
    assert refused.status_code == 400 and "datasets[0].dataset.digest" in refused.json()["message"]


def test_log_batch_keeps_a_point_once_as_mlflow_does(ml: Mlflow) -> None:
    run_id = ml.run()
    a = {"key": "loss", "value": 1.0, "timestamp": 1000, "step": 0}
    b = {"key": "loss", "value": 0.5, "timestamp": 2000, "step": 1}
    nan = {"key": "loss", "value": "NaN", "timestamp": 3000, "step": 2}
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [a, nan]})
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [a, b, nan, b]})
    history = ml.ok("GET", "metrics/get-history", {"run_id": run_id, "metric_key": "loss"})
    assert [(m["step"], m["value"]) for m in history["metrics"]] == [
        (0, 1.0),
        (1, 0.5),
        (2, "NaN"),
    ]
    # A point at a stored step with another value or time is a new point, as in MLflow.
    again = {**a, "value": 0.9}
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": [again]})
    history = ml.ok("GET", "metrics/get-history", {"run_id": run_id, "metric_key": "loss"})
    assert len(history["metrics"]) == 4


def test_infinities_come_back_clamped_and_long_values_truncated(ml: Mlflow) -> None:
    run_id = ml.run()
    points = [
        {"key": "g", "value": v, "timestamp": 1000, "step": s}
        for s, v in enumerate(["Infinity", "-Infinity"])
    ]
    params = [{"key": "config", "value": "c" * 7000}]
    tags = [{"key": "note", "value": "n" * 9000}]
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": points, "params": params})
    ml.ok("POST", "runs/set-tag", {"run_id": run_id, **tags[0]})
    history = ml.ok("GET", "metrics/get-history", {"run_id": run_id, "metric_key": "g"})
    assert [m["value"] for m in history["metrics"]] == [
        1.7976931348623157e308,
        -1.7976931348623157e308,
    ]
    data = ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["data"]
    assert {p["key"]: len(p["value"]) for p in data["params"]} == {"config": 6000}
    assert {t["key"]: len(t["value"]) for t in data["tags"]}["note"] == 8000


def test_it_refuses_what_mlflow_requires_as_a_string(ml: Mlflow) -> None:
    run_id = ml.run()
    for path, data, field in (
        ("experiments/create", {"name": "e", "artifact_location": 9.0}, "artifact_location"),
        ("runs/set-tag", {"run_id": run_id, "key": "k", "value": 5}, "value"),
        ("runs/log-parameter", {"run_id": run_id, "key": "k", "value": 5}, "value"),
    ):
        answer = ml.call("POST", path, data)
        assert answer.status_code == 400, path
        assert f"'{field}'" in answer.json()["message"], path


def test_deleting_an_experiment_deletes_its_runs_and_stops_writes(ml: Mlflow) -> None:
    experiment_id = ml.ok("POST", "experiments/create", {"name": "gone"})["experiment_id"]
    run = ml.ok("POST", "runs/create", {"experiment_id": experiment_id})["run"]["info"]["run_id"]
    ml.ok("POST", "experiments/delete", {"experiment_id": experiment_id})
    assert ml.ok("GET", "runs/get", {"run_id": run})["run"]["info"]["lifecycle_stage"] == "deleted"
    assert ml.ok("POST", "runs/search", {"experiment_ids": [experiment_id]}) == {"runs": []}
    point = {"key": "loss", "value": 1.0, "timestamp": 1, "step": 0}
    for path, data in (
        ("runs/log-batch", {"run_id": run, "metrics": [point]}),
        (
            "experiments/set-experiment-tag",
            {"experiment_id": experiment_id, "key": "k", "value": "v"},
        ),
        ("experiments/update", {"experiment_id": experiment_id, "new_name": "back"}),
    ):
        answer = ml.call("POST", path, data)
        assert answer.status_code == 400 and "'active' state" in answer.json()["message"], path
    ml.ok("POST", "experiments/restore", {"experiment_id": experiment_id})
    ml.ok("POST", "runs/log-batch", {"run_id": run, "metrics": [point]})


def test_history_endpoints_mlflow_ui_calls(ml: Mlflow) -> None:
    first, second = ml.run(), ml.run()
    for run_id, value in ((first, 1.0), (second, 2.0)):
        points = [
            {"key": "loss", "value": value, "timestamp": 1000 + s, "step": s} for s in range(3)
        ]
        ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": points})
    bulk = ml.client.get(
        f"{API}/metrics/get-history-bulk",
        {"run_id": [second, first], "metric_key": "loss", "max_results": 4},
        headers=ml.auth,
    ).json()
    expected = sorted([first, second])
    assert [(m["run_id"], m["step"]) for m in bulk["metrics"]] == [
        (expected[0], 0),
        (expected[0], 1),
        (expected[0], 2),
        (expected[1], 0),
    ]
    none = ml.call("GET", "metrics/get-history-bulk", {"metric_key": "loss"})
    assert none.status_code == 400 and "run_id" in none.json()["message"]
    bad_token = ml.call(
        "GET", "metrics/get-history", {"run_id": first, "metric_key": "loss", "page_token": "x"}
    )
    assert bad_token.status_code == 400 and "page_token" in bad_token.json()["message"]
    # An unknown run has no history (MLflow answers [] rather than an error).
    unknown = ml.ok("GET", "metrics/get-history", {"run_id": "f" * 32, "metric_key": "loss"})
    assert unknown == {"metrics": []}


def test_get_history_bulk_interval_samples_as_mlflows_sql_store(ml: Mlflow) -> None:
    run_id = ml.run()
    points = [
        {"key": "loss", "value": 1.0 / (s + 1), "timestamp": 1000 + s, "step": s} for s in range(10)
    ]
    ml.ok("POST", "runs/log-batch", {"run_id": run_id, "metrics": points})

    def steps(**bounds: int) -> list[int]:
        query = {"run_ids": run_id, "metric_key": "loss", "max_results": 4, **bounds}
        return [
            m["step"] for m in ml.ok("GET", "metrics/get-history-bulk-interval", query)["metrics"]
        ]

    # NTILE(4) over 10 points starts buckets at 0, 3, 6, 8; the last point replaces the last pick.
    assert steps() == [0, 3, 6, 9]
    assert steps(start_step=2, end_step=4) == [2, 3, 4]
    one_bound = ml.call(
        "GET",
        "metrics/get-history-bulk-interval",
        {"run_ids": run_id, "metric_key": "loss", "start_step": 2},
    )
    assert one_bound.status_code == 400 and "end_step" in one_bound.json()["message"]


def test_deleting_a_deleted_or_restoring_an_active_experiment_finds_nothing(ml: Mlflow) -> None:
    experiment_id = ml.ok("POST", "experiments/create", {"name": "twice"})["experiment_id"]
    again = ml.call("POST", "experiments/restore", {"experiment_id": experiment_id})
    assert (again.status_code, again.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    ml.ok("POST", "experiments/delete", {"experiment_id": experiment_id})
    again = ml.call("POST", "experiments/delete", {"experiment_id": experiment_id})
    assert (again.status_code, again.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    assert "already deleted" in again.json()["message"]


def test_an_experiment_id_of_other_than_digits_is_an_invalid_value(ml: Mlflow) -> None:
    answer = ml.call("GET", "experiments/get", {"experiment_id": "abc"})
    assert (answer.status_code, answer.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")
    assert "experiment_id" in answer.json()["message"]
    for path, data in (
        ("runs/search", {"experiment_ids": ["0", "abc"]}),
        ("logged-models/search", {"experiment_ids": ["x1"]}),
        ("experiments/search-datasets", {"experiment_ids": ["1.5"]}),
    ):
        answer = ml.call("POST", path, data)
        assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE", path
        assert "experiment_ids[" in answer.json()["message"], path
    missing = ml.call("GET", "experiments/get", {"experiment_id": "12345"})
    assert missing.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"


def test_a_deleted_runs_status_is_not_changed(ml: Mlflow) -> None:
    run_id = ml.run()
    ml.ok("POST", "runs/delete", {"run_id": run_id})
    answer = ml.call("POST", "runs/update", {"run_id": run_id, "status": "FINISHED"})
    assert answer.status_code == 400 and "'active' state" in answer.json()["message"]
    ml.ok("POST", "runs/restore", {"run_id": run_id})
    assert ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["info"]["status"] == "RUNNING"


def test_update_run_answers_the_end_time_the_client_sent(ml: Mlflow) -> None:
    run_id = ml.run()
    ml.ok("POST", "runs/update", {"run_id": run_id, "status": "FINISHED"})
    info = ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["info"]
    assert info["status"] == "FINISHED" and "end_time" not in info
    ml.ok("POST", "runs/update", {"run_id": run_id, "status": "KILLED", "end_time": 5000})
    assert ml.ok("GET", "runs/get", {"run_id": run_id})["run"]["info"]["end_time"] == 5000
