"""A redis-server of a test's own, on a free port, that the test kills (-9) and starts again
(bench.servers.LocalRedis, which the chaos bench uses too).

The shared Redis of CI (port 6379) is never touched: killing it would break every other test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.servers import LocalRedis, free_port

RedisServer = LocalRedis
__all__ = ["RedisServer", "free_port", "redis_server"]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if not LocalRedis.binary():
        pytest.skip("needs redis-server")
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.kill()
