"""The real stack the chaos bench owns, each piece a process (group) of its own: a PostgreSQL
cluster and a redis-server on free ports (bench/servers.py), the web server (gunicorn as
docker-compose.yml runs it, else `manage.py runserver`), a Celery worker on every queue and Celery
beat, as the documented standalone commands run them (docs/deployment.md), all on the production
settings (config.settings.base) pointed at this stack's database and Redis.

The bench stops and starts what it breaks (PostgreSQL, Redis, the web server); it never starts the
worker or beat again: one that dies stays dead, and that is a finding (`deaths()`).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import throwaway_secret_key
from bench.chaos import hooks
from bench.chaos.profile import Profile
from bench.harness import (
    ROOT,
    SETUP_CODE,
    BenchError,
    log,
    manage,
    start_group,
    stop_group,
    tail,
    wait_http,
)
from bench.servers import LocalPostgres, LocalRedis, free_port, postgres_bin, process_tree
from config.celery import QUEUE_ALERTS, QUEUE_DEFAULT, QUEUE_FORECASTING

DB_NAME = "runcast"
QUEUES = ",".join((QUEUE_DEFAULT, QUEUE_FORECASTING, QUEUE_ALERTS))
# Read by the bench from the environment of the process that runs it (CI's shared database and
# broker): none of them may reach the stack, which has its own.
INHERITED_OUT = ("DJANGO_", "RUNCAST_", "CELERY_", "DATABASE_URL", "CACHE_URL", "SECRET_KEY")


def missing_binaries() -> list[str]:
    """What the stack needs that this machine lacks (the CI test skips on any)."""
    missing = []
    if postgres_bin() is None:
        missing.append("PostgreSQL server (initdb, pg_ctl)")
    if LocalRedis.binary() is None:
        missing.append("redis-server")
    return missing


@dataclass
class Service:
    """A process group the stack started; `stopped_by_bench` tells a stop from a death."""

    name: str
    command: list[str]
    logfile: Path
    proc: subprocess.Popen[bytes] | None = None
    stopped_by_bench: bool = False

    def start(self, env: dict[str, str]) -> None:
        self.proc = start_group(self.command, env, self.logfile)
        self.stopped_by_bench = False

    def stop(self) -> None:
        self.stopped_by_bench = True
        if self.proc is not None:
            stop_group(self.proc)

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def died(self) -> bool:
        return self.exit_code is not None and not self.stopped_by_bench


class Stack:
    def __init__(self, profile: Profile, work: Path) -> None:
        self.profile = profile
        self.work = work
        bin_dir = postgres_bin()
        if bin_dir is None:
            raise BenchError("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
        self.postgres = LocalPostgres(bin_dir)
        self.redis = LocalRedis(work / "redis")
        self.web_port = 0
        self.token = ""
        self.tasks_dir = work / "tasks"
        self.services: dict[str, Service] = {}

    # -- the pieces ---------------------------------------------------------------------------

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def dsn(self) -> str:
        return self.postgres.url(DB_NAME)

    def env(self) -> dict[str, str]:
        """Every Runcast process's environment: production settings on this stack."""
        live = self.profile.liveness
        env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_OUT)}
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "config.settings.base",
                "DATABASE_URL": self.dsn,
                "CELERY_BROKER_URL": self.redis.url(0),
                "CACHE_URL": self.redis.url(1),
                "SECRET_KEY": throwaway_secret_key(),
                "DEBUG": "false",
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                "SITE_URL": self.web_url,
                # The worker's liveness sweep asks the web tier whether clients can reach it,
                # as docker-compose.yml and scripts/dev set it up.
                "RUNCAST_WEB_PROBE_URL": f"{self.web_url}/healthz",
                "RUNCAST_SWEEP_PERIOD_S": str(live.sweep_period_s),
                "RUNCAST_VAR_DIR": str(self.work / "var"),
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")]),
                hooks.TASKS_DIR: str(self.tasks_dir),
            }
        )
        if not live.production:
            env[hooks.STALL_MIN_S] = str(live.stall_min_s)
            env[hooks.RECONNECT_GRACE_S] = str(live.reconnect_grace_s)
        return env

    @property
    def web_server(self) -> str:
        """gunicorn where it is installed (docker-compose.yml), else Django's runserver."""
        return "gunicorn" if importlib.util.find_spec("gunicorn") is not None else "runserver"

    def _web_command(self) -> list[str]:
        bind = f"127.0.0.1:{self.web_port}"
        if self.web_server == "gunicorn":
            # docker-compose.yml's web service, on this machine's two cores.
            return [sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", bind,
                    "--workers", "2", "--threads", "8", "--preload",
                    "--max-requests", "5000", "--max-requests-jitter", "500"]  # fmt: skip
        return [sys.executable, "manage.py", "runserver", "--noreload", bind]

    def _services(self) -> dict[str, Service]:
        celery = [sys.executable, "-m", "celery", "-A", "config"]
        logs = self.work / "logs"
        return {
            "web": Service("web", self._web_command(), logs / "web.log"),
            # docker-compose.yml's worker and beat services (docs/deployment.md), the worker with
            # the bench's hooks (bench/chaos/hooks.py) as its one extra import.
            "worker": Service(
                "worker",
                [
                    *celery,
                    "worker",
                    "-Q",
                    QUEUES,
                    "--concurrency",
                    "2",
                    "--max-memory-per-child",
                    "400000",
                    "--loglevel",
                    "INFO",
                    "--hostname",
                    "chaos@%h",
                    "-I",
                    "bench.chaos.hooks",
                ],
                logs / "worker.log",
            ),
            "beat": Service(
                "beat",
                [
                    *celery,
                    "beat",
                    "--schedule",
                    str(self.work / "celerybeat-schedule"),
                    "--loglevel",
                    "INFO",
                ],
                logs / "beat.log",
            ),
        }

    def start(self) -> None:
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        self.postgres.init().start()
        self.postgres.createdb(DB_NAME)
        self.redis.start()
        self.web_port = free_port()
        env = self.env()
        manage(env, "migrate", "--noinput")
        self.token = manage(env, "shell", "-c", SETUP_CODE).strip().splitlines()[-1]
        self.services = self._services()
        for name in ("web", "worker", "beat"):
            self.services[name].start(env)
        self.wait_web()
        log(f"stack up in {time.monotonic() - began:.0f} s: {self.web_url}, PostgreSQL "
            f":{self.postgres.port}, Redis :{self.redis.port}")  # fmt: skip

    def wait_web(self, timeout: float = 120.0) -> None:
        web = self.services["web"]
        assert web.proc is not None
        wait_http(f"{self.web_url}/healthz", web.proc, web.logfile, timeout)

    # -- what the scenarios break and mend ----------------------------------------------------

    def stop_web(self) -> None:
        self.services["web"].stop()

    def start_web(self) -> None:
        self.services["web"].start(self.env())
        self.wait_web()

    def kill_postgres(self) -> int:
        return self.postgres.kill()

    def start_postgres(self) -> None:
        self.postgres.start()

    def kill_redis(self) -> None:
        self.redis.kill()

    def start_redis(self) -> None:
        self.redis.start()

    def worker_pool(self) -> list[int]:
        """The worker's pool processes (the prefork children that run the tasks)."""
        proc = self.services["worker"].proc
        if proc is None or proc.poll() is not None:
            return []
        return [pid for pid in process_tree(proc.pid) if pid != proc.pid]

    # -- findings -----------------------------------------------------------------------------

    def deaths(self) -> dict[str, dict[str, Any]]:
        """The services that exited without the bench stopping them: exit code and last words."""
        return {
            name: {"exit_code": service.exit_code, "log_tail": tail(service.logfile, 8)}
            for name, service in self.services.items()
            if service.died
        }

    def close(self) -> None:
        for service in self.services.values():
            with suppress(Exception):
                service.stop()
        with suppress(Exception):
            self.redis.remove()
        with suppress(Exception):
            self.postgres.remove()


@contextmanager
def running(profile: Profile, work: Path) -> Iterator[Stack]:
    stack = Stack(profile, work)
    try:
        stack.start()
        yield stack
    finally:
        stack.close()
