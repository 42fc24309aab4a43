"""Which reads config/replica.py sends to the replica. The router answers with alias names, so
these run without one; tests/config/test_replica_live.py runs them against a real standby."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import transaction
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import resolve

from config.replica import (
    PRIMARY,
    REPLICA,
    STICKY_COOKIE,
    ReplicaReadMiddleware,
    ReplicaRouter,
    replica_reads,
    routes,
)
from forecasting.models import Forecast
from tracker.models import ApiToken, MetricChunk, Run

router = ReplicaRouter()


def test_it_changes_nothing_without_a_replica_url() -> None:
    assert not settings.DATABASE_REPLICA_URL
    assert set(settings.DATABASES) == {"default"}
    assert not getattr(settings, "DATABASE_ROUTERS", [])
    assert "config.replica.ReplicaReadMiddleware" not in settings.MIDDLEWARE


def test_it_reads_the_primary_outside_a_replica_read_scope() -> None:
    # A worker, a command, a POST: never a scope, never the replica.
    assert router.db_for_read(Run) == PRIMARY
    assert router.db_for_read(Forecast) == PRIMARY


def test_it_reads_the_replica_inside_a_scope() -> None:
    with replica_reads():
        assert router.db_for_read(Run) == REPLICA
        assert router.db_for_read(MetricChunk) == REPLICA
    assert router.db_for_read(Run) == PRIMARY


def test_it_reads_the_primary_once_the_request_wrote() -> None:
    with replica_reads() as scope:
        assert router.db_for_write(Run) == PRIMARY
        assert scope.wrote
        assert router.db_for_read(Run) == PRIMARY


def test_it_keeps_who_may_read_on_the_primary_and_their_bookkeeping_does_not_count() -> None:
    with replica_reads() as scope:
        assert router.db_for_read(Session) == PRIMARY
        assert router.db_for_read(ApiToken) == PRIMARY
        router.db_for_write(ApiToken)  # a token's last use
        assert not scope.wrote
        assert router.db_for_read(Run) == REPLICA


@pytest.mark.django_db(transaction=True)
def test_it_reads_the_primary_inside_a_transaction() -> None:
    with replica_reads():
        with transaction.atomic():
            assert router.db_for_read(Run) == PRIMARY
        assert router.db_for_read(Run) == REPLICA


def test_it_writes_and_migrates_only_the_primary() -> None:
    assert router.db_for_write(Run, instance=Run(pk=1)) == PRIMARY
    assert router.allow_migrate(REPLICA, "tracker") is False
    assert router.allow_migrate(PRIMARY, "tracker") is True
    a, b = Run(), Run()
    a._state.db, b._state.db = REPLICA, PRIMARY
    assert router.allow_relation(a, b)
    b._state.db = "other"
    assert not router.allow_relation(a, b)


@pytest.mark.parametrize(
    ("method", "path", "cookies", "expected"),
    [
        ("GET", "/", {}, True),
        ("GET", "/board/", {}, True),
        ("GET", "/runs/p/r1/", {}, True),
        ("GET", "/runs/p/r1/series.json", {}, True),
        ("GET", "/projects/p/runs/", {}, True),
        ("GET", "/api/v1/runs", {}, True),
        ("HEAD", "/", {}, True),
        # The page a member's own form redirects to: the primary.
        ("GET", "/runs/p/r1/", {"rc_primary": "1"}, False),
        ("POST", "/runs/p/r1/plan/", {}, False),
        ("POST", "/api/v1/runs", {}, False),
        ("GET", "/projects/p/settings/", {}, False),
        # The MLflow API: its clients read back what they just logged.
        ("GET", "/api/2.0/mlflow/runs/get", {}, False),
        ("GET", "/healthz", {}, False),
    ],
)
def test_it_routes_only_the_heavy_reads(
    method: str, path: str, cookies: dict[str, str], expected: bool
) -> None:
    request = RequestFactory().generic(method, path)
    request.COOKIES.update(cookies)
    assert routes(request, resolve(path)) is expected


@pytest.mark.parametrize(
    ("method", "headers", "sticky"),
    [
        ("POST", {}, True),  # a browser's form: its next pages read the primary
        ("POST", {"HTTP_AUTHORIZATION": "Bearer rc_x_y"}, False),  # an ingest client
        ("GET", {}, False),
    ],
)
def test_it_keeps_a_browser_on_the_primary_after_its_own_write(
    method: str, headers: dict[str, str], sticky: bool
) -> None:
    middleware = ReplicaReadMiddleware(lambda request: HttpResponse("ok"))
    response = middleware(RequestFactory().generic(method, "/runs/p/r1/plan/", **headers))
    assert (STICKY_COOKIE in response.cookies) is sticky
    if sticky:
        cookie = response.cookies[STICKY_COOKIE]
        assert cookie["max-age"] == settings.RUNCAST_REPLICA_STICKY_S
        assert cookie["httponly"]


def test_it_refuses_a_replica_that_is_not_postgresql() -> None:
    # A SQLite "replica" would be a second, empty database that pages read as if it were ours.
    env = {**os.environ, "DATABASE_REPLICA_URL": "sqlite:////tmp/not-a-replica.sqlite3"}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.test"
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "DATABASE_REPLICA_URL must be a postgres:// URL" in done.stderr
