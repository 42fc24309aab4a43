"""Login throttling: N wrong passwords for one username from one address lock that pair out."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client

from config.settings.base import cache_config
from tests.redis_server import free_port

pytestmark = pytest.mark.django_db

LIMIT = 3


@pytest.fixture(autouse=True)
def _throttle(settings: Any) -> Iterator[None]:
    settings.RUNCAST_LOGIN_MAX_FAILURES = LIMIT
    settings.RUNCAST_LOGIN_LOCKOUT_S = 600
    cache.clear()
    yield
    cache.clear()  # no lockout outlives this module's tests (the cache is process-wide)


def login(client: Client, username: str, password: str, address: str = "10.0.0.1") -> Any:
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_it_locks_a_username_out_after_the_allowed_failures(client: Client, owner: User) -> None:
    for _ in range(LIMIT - 1):
        assert login(client, "owner", "wrong").status_code == 200
    locked = login(client, "owner", "wrong")
    assert locked.status_code == 429
    assert locked["Retry-After"] == "600"
    assert "Too many failed logins" in locked.content.decode()
    # Now even the right password is refused, without being checked.
    response = login(client, "owner", "pw-owner-123")
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session


def test_it_lets_the_user_in_after_the_lockout(client: Client, owner: User, settings: Any) -> None:
    settings.RUNCAST_LOGIN_LOCKOUT_S = 1  # the counter is a cache entry that expires with it
    for _ in range(LIMIT):
        login(client, "owner", "wrong")
    assert login(client, "owner", "pw-owner-123").status_code == 429
    time.sleep(1.2)
    assert login(client, "owner", "pw-owner-123").status_code == 302


def test_a_success_forgets_earlier_failures(client: Client, owner: User) -> None:
    for _ in range(LIMIT - 1):
        login(client, "owner", "wrong")
    assert login(client, "owner", "pw-owner-123").status_code == 302
    client.logout()
    for _ in range(LIMIT - 1):
        assert login(client, "owner", "wrong").status_code == 200


def test_a_locked_username_is_locked_only_from_that_address(client: Client, owner: User) -> None:
    for _ in range(LIMIT):
        login(client, "owner", "wrong", address="203.0.113.9")
    assert login(client, "owner", "pw-owner-123", address="203.0.113.9").status_code == 429
    # Someone guessing from elsewhere does not lock the owner out of their own address.
    assert login(client, "owner", "pw-owner-123", address="10.0.0.1").status_code == 302


def test_usernames_are_counted_apart_and_case_blind(
    client: Client, owner: User, member: User
) -> None:
    for i in range(LIMIT):
        login(client, "OWNER" if i % 2 else "owner", "wrong")
    assert login(client, "owner", "pw-owner-123").status_code == 429
    assert login(client, "member", "pw-member-123").status_code == 302


def test_the_admin_login_is_throttled_too(owner: User) -> None:
    owner.is_staff = True
    owner.save()
    client = Client(REMOTE_ADDR="10.0.0.7")
    for _ in range(LIMIT):
        client.post("/admin/login/", {"username": "owner", "password": "wrong"})
    response = client.post(
        "/admin/login/?next=/admin/", {"username": "owner", "password": "pw-owner-123"}
    )
    assert response.status_code == 200  # the form again: the right password was not accepted
    assert "_auth_user_id" not in client.session


# --- While the cache's Redis is down (issue 24 item 2: the login page answered 500) ----------


@pytest.fixture
def dead_cache(settings: Any) -> None:
    """The cache as production configures a Redis CACHE_URL, pointed at a port nothing listens
    on: Redis is down."""
    settings.CACHES = {"default": cache_config(f"redis://127.0.0.1:{free_port()}/1")}


def test_login_works_while_the_cache_is_down(
    client: Client, owner: User, dead_cache: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="config.cache"):
        assert login(client, "owner", "wrong").status_code == 200
        assert login(client, "owner", "pw-owner-123").status_code == 302
    assert client.session["_auth_user_id"] == str(owner.pk)
    # Said once for the outage, not once per request.
    outage = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(outage) == 1


def test_the_throttle_counts_locally_while_the_cache_is_down(
    client: Client, owner: User, dead_cache: None
) -> None:
    for _ in range(LIMIT - 1):
        assert login(client, "owner", "wrong").status_code == 200
    assert login(client, "owner", "wrong").status_code == 429
    assert login(client, "owner", "pw-owner-123").status_code == 429
    assert login(client, "owner", "pw-owner-123", address="10.0.0.2").status_code == 302
