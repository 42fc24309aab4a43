"""A redis-server of a test's own, on a free port, that the test kills (-9) and starts again.

The shared Redis of CI (port 6379) is never touched: killing it would break every other test.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process at a time on a fixed port, with its data in `folder`: append-only
    as in docker-compose.yml, so what it held survives a kill -9 as it does there."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed"
        self.proc = subprocess.Popen(
            [
                *(binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *("--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.folder)),
            ],
            stdout=open(self.folder / "redis.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not self.answers():
            assert self.proc.poll() is None, (self.folder / "redis.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "redis-server did not answer PING in 30 s"
            time.sleep(0.05)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """kill -9: no shutdown, no goodbye to its clients (the outage of issue 24)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if not shutil.which("redis-server"):
        pytest.skip("needs redis-server")
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.kill()
