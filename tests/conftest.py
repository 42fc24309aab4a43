"""Shared fixtures: an owner, a member, a viewer and an outsider, one project, its tokens."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery.signals import after_task_publish
from django.contrib.auth.models import User
from django.test import Client
from pytest_django.fixtures import Settings as DjangoSettings

from config.celery import app as celery_app
from tests import broker
from tracker.models import ApiToken, Membership, Project
from tracker.services import token_create

# The local SMTP server, HTTP sink and alert fixtures: alert pages are tested under tests/dashboard.
# tests.servers: a PostgreSQL cluster a test may stop, and a web server in a subprocess on it.
pytest_plugins = ["tests.alerts.fixtures", "tests.servers"]


@pytest.fixture(autouse=True)
def _fresh_cache() -> Any:
    """Each test starts with an empty cache, as the database is emptied between tests. The
    cache holds markers with a lifetime (the forecast debounce, "alert dispatch pending"): one
    left by a test whose queued task no worker ran (a real worker consuming only the forecasting
    queue) made a later test's alerts wait for the beat sweep, which tests do not run."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def celery_eager(settings: DjangoSettings) -> Iterator[None]:
    """Tasks run in-process when sent (`.delay()` returns once the task has run), for a test
    whose outcome needs them run: its alerts, its forecasts after an ingest. Without it they go
    to the broker as on a server and no worker runs them. Mark a test or module with
    `pytest.mark.eager` rather than asking for this fixture by name."""
    # Celery reads CELERY_TASK_ALWAYS_EAGER into its conf once, when the conf is first used
    # (perhaps just here: read it before changing the setting, or it keeps True): set both.
    before = celery_app.conf.task_always_eager
    settings.CELERY_TASK_ALWAYS_EAGER = True
    celery_app.conf.task_always_eager = True
    # Load the forecasting stack now, as a worker does before forking, not inside the first
    # request of a live-server test that enqueues a forecast (seconds: a client times out).
    from forecasting import compute, liveness  # noqa: F401

    yield
    celery_app.conf.task_always_eager = before


@pytest.fixture(autouse=True)
def _eager_when_marked(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("eager"):
        request.getfixturevalue("celery_eager")


@pytest.fixture(autouse=True)
def _no_queued_tasks_left() -> Iterator[None]:
    """A task a test sent and no worker ran is dropped at its end: otherwise the broker (Redis
    in CI, kept between runs) grows over the suite, and a later test's real worker would run
    it, against that test's rows (ids are reused once tables are emptied)."""
    sent: list[str] = []

    def note(sender: str | None = None, **kwargs: object) -> None:
        sent.append(str(sender))

    after_task_publish.connect(note, weak=False)
    yield
    after_task_publish.disconnect(note)
    if sent:
        broker.purge()


@pytest.fixture
def owner(db: Any) -> User:
    return User.objects.create_user("owner", "owner@example.com", "pw-owner-123")


@pytest.fixture
def member(db: Any) -> User:
    return User.objects.create_user("member", "member@example.com", "pw-member-123")


@pytest.fixture
def viewer(db: Any) -> User:
    return User.objects.create_user("viewer", "viewer@example.com", "pw-viewer-123")


@pytest.fixture
def outsider(db: Any) -> User:
    return User.objects.create_user("outsider", "outsider@example.com", "pw-outsider-123")


@pytest.fixture
def project(owner: User, member: User, viewer: User) -> Project:
    project = Project.objects.create(slug="llm", name="LLM pretraining", gpu_hour_price=2.5)
    Membership.objects.create(project=project, user=owner, role=Membership.Role.OWNER)
    Membership.objects.create(project=project, user=member, role=Membership.Role.MEMBER)
    Membership.objects.create(project=project, user=viewer, role=Membership.Role.VIEWER)
    return project


@pytest.fixture
def other_project(outsider: User) -> Project:
    other = Project.objects.create(slug="other", name="Someone else's")
    Membership.objects.create(project=other, user=outsider, role=Membership.Role.OWNER)
    return other


@pytest.fixture
def write_token(project: Project) -> str:
    return token_create(project=project, name="trainer", scope=ApiToken.Scope.WRITE)


@pytest.fixture
def read_token(project: Project) -> str:
    return token_create(project=project, name="reader", scope=ApiToken.Scope.READ)


@pytest.fixture
def other_write_token(other_project: Project) -> str:
    return token_create(project=other_project, name="theirs", scope=ApiToken.Scope.WRITE)


ApiCall = Callable[..., Any]


@pytest.fixture
def api(client: Client) -> ApiCall:
    """POST/GET JSON to /api/v1/ with a bearer token; returns the response."""

    def call(method: str, path: str, token: str | None, body: Any = None, raw: bytes | None = None):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        fn = getattr(client, method.lower())
        if method.upper() == "GET":
            return fn(f"/api/v1{path}", **headers)
        return fn(f"/api/v1{path}", data=data, content_type="application/json", **headers)

    return call
