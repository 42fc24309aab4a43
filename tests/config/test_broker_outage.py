"""A real Celery worker (the project's app, prefork, as docker-compose.yml runs it) outlives a
kill -9 of its Redis and goes back to work by itself once Redis is back (issue 24 item 1)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from config.celery import app
from tests.redis_server import RedisServer, redis_server  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_for_log(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log.read_text(errors="replace"):
            assert self.alive(), f"the worker exited:\n{self.tail()}"
            assert time.monotonic() < deadline, f"no {text!r} in the worker's log:\n{self.tail()}"
            time.sleep(0.1)


@pytest.fixture
def worker(redis_server: RedisServer, tmp_path: Path) -> Iterator[Worker]:  # noqa: F811
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.test",
        CELERY_BROKER_URL=redis_server.url(0),
        CACHE_URL="locmemcache://",
        RUNCAST_VAR_DIR=str(tmp_path / "var"),
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    log = tmp_path / "worker.log"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "config", "worker"),
            *("-I", "tests.config.worker_tasks", "-Q", "default", "--concurrency", "2"),
            *("-n", f"outage-{redis_server.port}@%h", "--loglevel", "INFO"),
        ],
        cwd=ROOT,
        env=env,
        stdout=open(log, "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its pool processes stop with it, as one process group
    )
    try:
        yield Worker(proc, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def send(server: RedisServer, name: str, **kwargs: Any) -> None:
    with app.connection_for_write(server.url(0)) as connection:
        app.send_task(name, kwargs=kwargs, queue="default", connection=connection)


def wait_for_file(path: Path, worker: Worker, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert worker.alive(), f"the worker exited:\n{worker.tail()}"
        assert time.monotonic() < deadline, f"{path.name} never appeared:\n{worker.tail()}"
        time.sleep(0.1)


def test_it_survives_a_redis_kill_and_consumes_again_when_redis_is_back(
    redis_server: RedisServer,  # noqa: F811
    worker: Worker,
    tmp_path: Path,
) -> None:
    # Generous: on a loaded 2-core machine the worker's start (the forecasting stack) is slow.
    send(redis_server, "tests.outage.touch", path=str(tmp_path / "ready"))
    wait_for_file(tmp_path / "ready", worker, timeout_s=120)

    # One task running (unacknowledged: acks_late) while the other pool process leaves the
    # consumer waiting on Redis for more: what a busy Runcast worker always is.
    started, release = tmp_path / "started", tmp_path / "release"
    send(
        redis_server,
        "tests.outage.hold",
        started=str(started),
        release=str(release),
        timeout_s=60.0,
    )
    wait_for_file(started, worker, timeout_s=60)

    redis_server.kill()
    worker.wait_for_log("Connection to broker lost", timeout_s=30)
    redis_server.start()
    release.write_text("go")

    # Nobody touches the worker: it reconnects on its own and takes new work.
    send(redis_server, "tests.outage.touch", path=str(tmp_path / "after"))
    wait_for_file(tmp_path / "after", worker, timeout_s=120)
    assert worker.alive()
    assert "Unrecoverable error" not in worker.tail()


def test_it_retries_the_broker_for_as_long_as_it_is_down() -> None:
    """Celery's default gives up after 100 attempts (about 46 minutes of backoff) and the
    worker exits: a Redis down for an hour would stop forecasts and alerts for good."""
    assert app.conf.broker_connection_retry is True
    assert app.conf.broker_connection_retry_on_startup is True
    assert app.conf.broker_connection_max_retries is None
