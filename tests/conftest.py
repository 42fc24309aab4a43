"""Shared fixtures: an owner, a member, a viewer and an outsider, one project, its tokens."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tracker.models import ApiToken, Membership, Project
from tracker.services import token_create

# The local SMTP server, HTTP sink and alert fixtures: alert pages are tested under tests/dashboard.
pytest_plugins = ["tests.alerts.fixtures"]


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
