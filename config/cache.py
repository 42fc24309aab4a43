"""The cache backend for a Redis CACHE_URL: Django's RedisCache, degrading to a per-process cache
while Redis does not answer.

Why (issue 24 item 2). The cache holds markers and counters whose loss for a while costs little:
the login throttle's failure counts, the forecast and alert-dispatch debounces. With Django's
RedisCache, a dead Redis turned each of those reads into a ConnectionError, and the login page
into a 500 for as long as the outage lasted. Here a connection error (or a timeout) serves the
call from a cache in this process instead, logged once per outage: the throttle counts each
web process's failures on its own (at most RUNCAST_LOGIN_MAX_FAILURES per process per lockout),
each process debounces on its own. While Redis is down, calls go straight to that local cache
and Redis is tried again every RETRY_S, so an unreachable host costs one connect timeout per
period, not one per request. When Redis answers again it is used again, and what the local
cache held is left to expire.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

# While Redis is down, seconds between tries of it.
RETRY_S = 5.0
# Login counters and a debounce marker per active run: far under this.
FALLBACK_MAX_ENTRIES = 10_000

T = TypeVar("T")


class _Outage:
    """Whether one Redis location is down, for the whole process: Django makes a cache backend
    per thread, and every thread must see the same outage (and log it once)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.lock = threading.Lock()
        self.down_since: float | None = None
        self.retry_at = 0.0

    def skip(self) -> bool:
        return self.retry_at > time.monotonic()

    def began(self, exc: Exception) -> None:
        now = time.monotonic()
        with self.lock:
            self.retry_at = now + RETRY_S
            if self.down_since is None:
                self.down_since = now
                logger.warning(
                    "cache: Redis at %s does not answer (%s); using a cache local to this "
                    "process until it does (login throttle and debounces count per process)",
                    self.location,
                    exc,
                )

    def ended(self) -> None:
        if self.down_since is None:  # the usual case, without taking the lock
            return
        with self.lock:
            if self.down_since is not None:
                logger.warning(
                    "cache: Redis at %s answers again after %.0f s",
                    self.location,
                    time.monotonic() - self.down_since,
                )
                self.down_since = None


_outages: dict[str, _Outage] = {}
_outages_lock = threading.Lock()


def _outage_for(location: str) -> _Outage:
    with _outages_lock:
        return _outages.setdefault(location, _Outage(location))


class DegradingRedisCache(RedisCache):
    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._outage = _outage_for(server)
        # Named per location, so every thread's backend shares one local store.
        self._fallback = LocMemCache(
            f"runcast-cache-fallback:{server}",
            {
                "TIMEOUT": params.get("TIMEOUT", 300),
                "KEY_PREFIX": params.get("KEY_PREFIX", ""),
                "VERSION": params.get("VERSION", 1),
                "KEY_FUNCTION": params.get("KEY_FUNCTION"),
                "OPTIONS": {"MAX_ENTRIES": FALLBACK_MAX_ENTRIES},
            },
        )

    def _either(self, redis_call: Callable[[], T], local_call: Callable[[], T]) -> T:
        if self._outage.skip():
            return local_call()
        try:
            result = redis_call()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            self._outage.began(exc)
            return local_call()
        self._outage.ended()
        return result

    def add(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        return self._either(
            lambda: super(DegradingRedisCache, self).add(key, value, timeout, version),
            lambda: self._fallback.add(key, value, timeout, version),
        )

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return self._either(
            lambda: super(DegradingRedisCache, self).get(key, default, version),
            lambda: self._fallback.get(key, default, version),
        )

    def set(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        self._either(
            lambda: super(DegradingRedisCache, self).set(key, value, timeout, version),
            lambda: self._fallback.set(key, value, timeout, version),
        )

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return self._either(
            lambda: super(DegradingRedisCache, self).touch(key, timeout, version),
            lambda: self._fallback.touch(key, timeout, version),
        )

    def delete(self, key: Any, version: int | None = None) -> bool:
        return self._either(
            lambda: super(DegradingRedisCache, self).delete(key, version),
            lambda: self._fallback.delete(key, version),
        )

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        keys = list(keys)
        return self._either(
            lambda: super(DegradingRedisCache, self).get_many(keys, version),
            lambda: self._fallback.get_many(keys, version),
        )

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return self._either(
            lambda: super(DegradingRedisCache, self).has_key(key, version),
            lambda: self._fallback.has_key(key, version),
        )

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        # A missing key raises ValueError from either store, as Django's caches do.
        return self._either(
            lambda: super(DegradingRedisCache, self).incr(key, delta, version),
            lambda: self._fallback.incr(key, delta, version),
        )

    def set_many(
        self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> list[Any]:
        return self._either(
            lambda: super(DegradingRedisCache, self).set_many(data, timeout, version),
            lambda: self._fallback.set_many(data, timeout, version),
        )

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        keys = list(keys)
        self._either(
            lambda: super(DegradingRedisCache, self).delete_many(keys, version),
            lambda: self._fallback.delete_many(keys, version),
        )

    def clear(self) -> None:
        self._fallback.clear()
        self._either(lambda: super(DegradingRedisCache, self).clear(), lambda: None)
