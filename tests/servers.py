"""Real dependencies a test owns: a PostgreSQL cluster of its own on a free port, and a Runcast
web server in a subprocess pointed at it, that a test can stop and start again mid-test.

The shared database the suite runs on (DATABASE_URL) must never be stopped, so outage tests
use these. The cluster itself (bench/servers.py) is shared with the benches.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from bench.servers import LocalPostgres, free_port, postgres_bin

__all__ = ["LocalPostgres", "free_port", "local_postgres", "manage", "server_env", "web_server"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def local_postgres() -> Iterator[LocalPostgres]:
    """A running cluster of the test session's own; a test that stops it starts it again."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    server = LocalPostgres(bin_dir).init()
    server.start()
    yield server
    server.remove()


def manage(*args: str, env: Mapping[str, str], timeout: float = 300) -> str:
    """Run manage.py in a subprocess with `env`; return its stdout."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def server_env(database_url: str, var_dir: Path) -> dict[str, str]:
    """A Runcast web process's environment on `database_url`: test settings, nothing shared
    with the suite (its own cache, broker folder and var dir)."""
    return {
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": database_url,
        "CACHE_URL": "locmemcache://",
        "CELERY_BROKER_URL": "filesystem://",
        "RUNCAST_VAR_DIR": str(var_dir),
        "DEBUG": "false",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")]),
    }


@contextlib.contextmanager
def web_server(env: Mapping[str, str], *, gunicorn: bool = False) -> Iterator[str]:
    """`manage.py runserver` (threaded, no reloader) on a free port; yields its base URL.

    `gunicorn`: one gunicorn worker with one thread instead, as deployed: its requests reuse
    one database connection per alias (runserver opens new ones for each request's thread)."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="runcast-web-"))
    if gunicorn:
        argv = [sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", f"127.0.0.1:{port}"]
        argv += ["--workers", "1", "--threads", "1", "--timeout", "60"]
    else:
        argv = [sys.executable, str(ROOT / "manage.py"), "runserver", "--noreload"]
        argv += [f"127.0.0.1:{port}"]
    with open(folder / "web.log", "wb") as log:
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_listening(url, process, folder / "web.log")
            yield url
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    shutil.rmtree(folder, ignore_errors=True)


def _wait_listening(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"runserver exited:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (perhaps 503 if its database is down): it listens
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"runserver did not answer within 60 s:\n{log.read_text()[-3000:]}")
