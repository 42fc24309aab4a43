"""The cache of a Redis CACHE_URL degrades while Redis is down and comes back with it (issue 24
item 2), against a real redis-server that the test kills -9 and restarts."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.core.cache import cache

from config import cache as degrading
from config.settings.base import cache_config
from tests.redis_server import RedisServer, redis_server  # noqa: F401 (a fixture)


@pytest.fixture
def redis_cache(redis_server: RedisServer, settings: Any, monkeypatch: Any) -> RedisServer:  # noqa: F811
    settings.CACHES = {"default": cache_config(redis_server.url(1))}
    # Redis is tried again on every call, not after RETRY_S: the test controls when it is back.
    monkeypatch.setattr(degrading, "RETRY_S", 0.0)
    return redis_server


def test_it_serves_from_this_process_while_redis_is_down_and_from_redis_once_back(
    redis_cache: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    cache.set("before", "in redis", timeout=600)
    redis_cache.kill()
    with caplog.at_level(logging.WARNING, logger="config.cache"):
        assert cache.add("marker", 1, timeout=600) is True  # the debounce: first of the window
        assert cache.add("marker", 1, timeout=600) is False
        assert cache.incr("marker") == 2
        assert cache.get("before") is None  # Redis's keys are out of reach meanwhile
        redis_cache.start()
        assert cache.get("before") == "in redis"  # appendonly: it kept its keys
        assert cache.get("marker") is None  # what the outage counted stayed in this process
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(" (")[0] for m in messages if "does not answer" in m] == [
        f"cache: Redis at {redis_cache.url(1)} does not answer"
    ]
    assert [m.split(" after")[0] for m in messages if "answers again" in m] == [
        f"cache: Redis at {redis_cache.url(1)} answers again"
    ]


def test_a_missing_counter_is_still_a_value_error_while_redis_is_down(
    redis_cache: RedisServer,
) -> None:
    """dashboard.login relies on it: incr() of an expired count starts a new one."""
    redis_cache.kill()
    with pytest.raises(ValueError, match="not found"):
        cache.incr("never-set")
