"""An MLflow error quotes at most 64 characters of any input, with its length: a 100 KB run id
came back whole in a 100,078-byte 404. An id longer than any id can be is refused naming its
field (INVALID_PARAMETER_VALUE), not looked up. Runs without the mlflow package."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

HUGE = "x" * 100_000
# Any body answering an error here is a short sentence; the input it refused was 100 KB.
MAX_BODY = 1_000


def _call(client: Client, token: str, method: str, path: str, data: dict[str, Any]) -> Any:
    auth = {"Authorization": f"Bearer {token}"}
    url = f"/api/2.0/mlflow/{path}"
    if method == "GET":
        return client.get(url, data, headers=auth)
    return client.post(url, data=json.dumps(data), content_type="application/json", headers=auth)


def _run(client: Client, token: str) -> str:
    answer = _call(client, token, "POST", "runs/create", {"experiment_id": "0"})
    return str(answer.json()["run"]["info"]["run_id"])


@pytest.mark.parametrize(
    ("method", "path", "data", "field"),
    [
        ("GET", "runs/get", {"run_id": HUGE}, "run_id"),
        ("GET", "runs/get", {"run_uuid": HUGE}, "run_uuid"),
        (
            "POST",
            "runs/log-metric",
            {"run_id": HUGE, "key": "l", "value": 1, "timestamp": 1},
            "run_id",
        ),
        ("POST", "runs/update", {"run_id": HUGE, "status": "FINISHED"}, "run_id"),
        ("GET", "experiments/get", {"experiment_id": HUGE}, "experiment_id"),
        ("POST", "runs/create", {"experiment_id": HUGE}, "experiment_id"),
        ("POST", "runs/search", {"experiment_ids": ["0", HUGE]}, "experiment_ids[1]"),
        (
            "GET",
            "metrics/get-history-bulk-interval",
            {"run_ids": [HUGE], "metric_key": "l"},
            "run_ids[0]",
        ),
    ],
)
def test_it_refuses_an_id_longer_than_any_naming_its_field(
    client: Client, write_token: str, method: str, path: str, data: dict[str, Any], field: str
) -> None:
    answer = _call(client, write_token, method, path, data)

    assert answer.status_code == 400
    assert len(answer.content) < MAX_BODY
    body = answer.json()
    assert body["error_code"] == "INVALID_PARAMETER_VALUE"
    assert f"'{field}' exceeds the maximum length" in body["message"]


def test_a_missing_run_is_named_in_full_when_its_id_could_be_one(
    client: Client, write_token: str
) -> None:
    run_id = "a" * 64
    answer = _call(client, write_token, "GET", "runs/get", {"run_id": run_id})
    assert answer.status_code == 404
    assert answer.json() == {
        "error_code": "RESOURCE_DOES_NOT_EXIST",
        "message": f"Run with id={run_id} not found",
    }


KEY = "k" * 250
LONG_NAME = "n" * 500
RUN = "<the run's id>"
DUPLICATES = [{"key": f"{i:03d}" + "p" * 247, "value": "1"} for i in range(50)] * 2
QUOTING: dict[str, tuple[str, str, dict[str, Any]]] = {
    "a filter": ("POST", "runs/search", {"experiment_ids": ["0"], "filter": "params.a ~ " + HUGE}),
    "an order": ("POST", "runs/search", {"experiment_ids": ["0"], "order_by": ["." + HUGE]}),
    "a filter key": (
        "POST",
        "runs/search",
        {"experiment_ids": ["0"], "filter": f"metrics.{HUGE} LIKE 'a'"},
    ),
    "an attribute": (
        "POST",
        "runs/search",
        {"experiment_ids": ["0"], "filter": f"attributes.{HUGE} = 'a'"},
    ),
    "a list": ("POST", "runs/search", {"experiment_ids": ["0"], "filter": f"tags.t IN ({HUGE})"}),
    "an experiment name": (
        "GET",
        "experiments/get-by-name",
        {"experiment_name": LONG_NAME[:-1] + "m"},
    ),
    "a taken name": ("POST", "experiments/create", {"name": LONG_NAME}),
    "a changed param": (
        "POST",
        "runs/log-parameter",
        {"run_id": RUN, "key": KEY, "value": "w" * 6000},
    ),
    "a missing tag": ("POST", "runs/delete-tag", {"run_id": RUN, "key": HUGE}),
    "a value": (
        "POST",
        "runs/log-metric",
        {"run_id": RUN, "key": "l", "value": HUGE, "timestamp": 1},
    ),
    "a name": ("POST", "runs/set-tag", {"run_id": RUN, "key": "a/" + HUGE + "/../b", "value": "1"}),
    "a page token": (
        "GET",
        "metrics/get-history",
        {"run_id": RUN, "metric_key": "l", "max_results": 1, "page_token": HUGE},
    ),
    "duplicate params": ("POST", "runs/log-batch", {"run_id": RUN, "params": DUPLICATES}),
    "a path": ("POST", "runs/" + "z" * 5000, {}),
}


@pytest.mark.parametrize("what", list(QUOTING))
def test_an_error_quotes_64_characters_of_the_input_and_its_length(
    client: Client, write_token: str, what: str
) -> None:
    run_id = _run(client, write_token)
    _call(client, write_token, "POST", "experiments/create", {"name": LONG_NAME})
    _call(
        client,
        write_token,
        "POST",
        "runs/log-parameter",
        {"run_id": run_id, "key": KEY, "value": "v" * 6000},
    )
    method, path, data = QUOTING[what]
    data = {k: run_id if v == RUN else v for k, v in data.items()}

    answer = _call(client, write_token, method, path, data)

    assert 400 <= answer.status_code < 500
    assert len(answer.content) < MAX_BODY, answer.content[:300]
    assert " characters)" in answer.json()["message"]
