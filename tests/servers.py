"""Real dependencies a test owns: a PostgreSQL cluster of its own on a free port, and a Runcast
web server in a subprocess pointed at it, that a test can stop and start again mid-test.

The shared database the suite runs on (DATABASE_URL) must never be stopped, so outage tests
use these. PostgreSQL refuses to run as root: as root the cluster belongs to `postgres`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def postgres_bin() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, or Debian's /usr/lib/postgresql/<v>/bin."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    if versions:
        return Path(versions[0]).parent
    # A lone pg_ctl on PATH may be a symlink into the folder that holds the rest.
    found = shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


class LocalPostgres:
    """One throwaway cluster (trust auth, no fsync) on 127.0.0.1:<free port>."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="runcast-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=120)

    def init(self) -> LocalPostgres:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        return self

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def start(self) -> None:
        """Start the cluster, if it is not running (a crash is recovered from the WAL)."""
        if self.running():
            return
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c full_page_writes=off"
        result = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60",
            "start", check=False,
        )  # fmt: skip
        if result.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"postgres did not start: {result.stderr}\n{log[-2000:]}")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the cluster. `immediate` drops every connection at once and skips the shutdown
        checkpoint, as a crash does (the next start recovers from the WAL)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def createdb(self, name: str) -> None:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)

    def url(self, db: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


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
def web_server(env: Mapping[str, str]) -> Iterator[str]:
    """`manage.py runserver` (threaded, no reloader) on a free port; yields its base URL."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="runcast-web-"))
    with open(folder / "web.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "runserver",
                "--noreload",
                f"127.0.0.1:{port}",
            ],
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
