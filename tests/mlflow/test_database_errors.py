"""The MLflow API waits out only an outage: a database that cannot be reached is 503 with
Retry-After (the client retries it and keeps its points); an IntegrityError or DataError is a
bug or the request's fault, answered 500 with a fixed message that quotes nothing of it (all
DatabaseErrors were a 503 to retry). Runs without the mlflow package."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import DataError, IntegrityError, InterfaceError, OperationalError
from django.test import Client

from config.errors import DATABASE_RETRY_AFTER_S
from tracker.mlflow import services

pytestmark = pytest.mark.django_db

SECRET = "loss-from-the-request"


def _log_metric(client: Client, token: str) -> Any:
    auth = {"Authorization": f"Bearer {token}"}
    created = client.post(
        "/api/2.0/mlflow/runs/create",
        data=json.dumps({"experiment_id": "0"}),
        content_type="application/json",
        headers=auth,
    )
    run_id = created.json()["run"]["info"]["run_id"]
    body = {"run_id": run_id, "key": SECRET, "value": 1.0, "timestamp": 1, "step": 0}
    return client.post(
        "/api/2.0/mlflow/runs/log-metric",
        data=json.dumps(body),
        content_type="application/json",
        headers=auth,
    )


def _raise(exc: BaseException) -> Any:
    def run_log(**kwargs: Any) -> None:
        raise exc

    return run_log


@pytest.mark.parametrize(
    "exc",
    [OperationalError("connection refused"), InterfaceError("connection already closed")],
    ids=["refused", "closed"],
)
def test_a_lost_database_is_a_503_to_retry(
    client: Client, write_token: str, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    monkeypatch.setattr(services, "run_log", _raise(exc))

    answer = _log_metric(client, write_token)

    assert answer.status_code == 503
    assert answer["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
    assert answer.json()["error_code"] == "TEMPORARILY_UNAVAILABLE"


@pytest.mark.parametrize(
    "exc",
    [IntegrityError(f'duplicate key violates "{SECRET}"'), DataError(f"bad value {SECRET}")],
    ids=["integrity", "data"],
)
def test_any_other_database_error_is_a_500_that_quotes_nothing(
    client: Client, write_token: str, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    monkeypatch.setattr(services, "run_log", _raise(exc))

    answer = _log_metric(client, write_token)

    assert answer.status_code == 500
    assert answer.json() == {"error_code": "INTERNAL_ERROR", "message": "internal server error"}
    assert SECRET not in answer.content.decode()
