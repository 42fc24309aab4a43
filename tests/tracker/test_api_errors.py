"""An error no view expected still answers /api/v1's JSON shape: 503 with Retry-After for a
database that cannot be reached, 500 with a fixed message for anything else; never Django's
HTML page, never a traceback (ninja's answer with DEBUG on), never the request echoed back.

The fault is injected at one seam, the ingest service, as a bug or a dropped connection would
raise it there; tests/tracker/test_database_outage.py stops a real PostgreSQL instead.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import IntegrityError, InterfaceError, OperationalError
from django.test import Client, RequestFactory

from config.errors import DATABASE_RETRY_AFTER_S, server_error
from tracker import services

SECRET = "loss-from-the-request"
BATCH = {"session": "s1", "seq": 1, "metrics": {SECRET: {"steps": [1], "values": [0.5]}}}


@pytest.fixture
def created(api: Any, write_token: str) -> str:
    answer = api("POST", "/runs", write_token, {"id": "r1", "session": "s1", "project": "llm"})
    assert answer.status_code == 201
    return "r1"


def _raise(exc: BaseException) -> Any:
    def ingest(**kwargs: Any) -> None:
        raise exc

    return ingest


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize(
    "exc",
    [
        ValueError(f"cannot store {SECRET!r}"),
        IntegrityError(f'duplicate key value violates "{SECRET}"'),
    ],
    ids=["bug", "integrity"],
)
def test_an_unexpected_error_is_a_json_500_that_echoes_nothing(
    api: Any,
    write_token: str,
    created: str,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    debug: bool,
    exc: Exception,
) -> None:
    settings.DEBUG = debug
    monkeypatch.setattr(services, "batch_ingest", _raise(exc))

    with caplog.at_level(logging.ERROR, logger="config.errors"):
        answer = api("POST", f"/runs/{created}/batches", write_token, BATCH)

    assert answer.status_code == 500
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == {"error": "internal server error", "field": None}
    assert "Retry-After" not in answer
    # The server's log has the whole story for whoever fixes it.
    [record] = [r for r in caplog.records if r.name == "config.errors"]
    assert record.exc_info is not None and record.exc_info[1] is exc


@pytest.mark.parametrize(
    "exc",
    [
        OperationalError("connection to server at 127.0.0.1 failed: Connection refused"),
        InterfaceError("connection already closed"),
    ],
    ids=["refused", "closed"],
)
def test_a_lost_database_is_a_json_503_to_retry(
    api: Any, write_token: str, created: str, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    monkeypatch.setattr(services, "batch_ingest", _raise(exc))

    answer = api("POST", f"/runs/{created}/batches", write_token, BATCH)

    assert answer.status_code == 503
    assert answer["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
    assert answer.json() == {"error": "database unavailable; retry later", "field": None}


class _BrokenConnection:
    def cursor(self) -> Any:
        raise RuntimeError(f"not a database error: {SECRET}")


def test_healthz_answers_json_for_an_error_outside_the_api(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """handler500 is the backstop for what no API handler saw (a middleware, /healthz)."""
    import config.views

    monkeypatch.setattr(config.views, "connection", _BrokenConnection())
    answer = Client(raise_request_exception=False).get("/healthz")

    assert answer.status_code == 500
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == {"error": "internal server error", "field": None}


def test_pages_keep_the_html_error_page(rf: RequestFactory) -> None:
    try:
        raise RuntimeError("a page's bug")
    except RuntimeError:
        answer = server_error(rf.get("/projects/llm/"))
    assert answer.status_code == 500
    assert answer["Content-Type"].startswith("text/html")
