"""The stock `mlflow` client against a live Runcast server (pytest-django's live_server).

Tests that need the `mlflow` package skip where the `mlflow` extra is not installed
(`RUNCAST_TEST_EXTRAS=mlflow scripts/bootstrap` installs it; CI does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tracker.models import ApiToken, Membership, Project
from tracker.services import token_create


@pytest.fixture
def ml_project(django_user_model: Any) -> Project:
    user = django_user_model.objects.create_user("trainer", password="pw-trainer-123")
    project = Project.objects.create(slug="ml", name="ML")
    Membership.objects.create(project=project, user=user, role=Membership.Role.OWNER)
    return project


@pytest.fixture
def ml_token(ml_project: Project) -> str:
    return token_create(project=ml_project, name="mlflow", scope=ApiToken.Scope.WRITE)


@pytest.fixture
def mlflow_env(live_server: Any, ml_token: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`mlflow` pointed at the live server with the project's write token, as a user would."""
    mlflow = pytest.importorskip("mlflow")
    for name in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", live_server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", ml_token)
    # The client's default retries a 5xx for minutes; three quick retries are enough here.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    if connection.vendor == "sqlite":
        # The SQLite test database is in-memory with a shared cache, whose table locks fail a
        # concurrent writer at once instead of waiting (Runcast's own SQLite file waits, and
        # PostgreSQL, as in CI, takes concurrent batches): the async client sends one at a time.
        monkeypatch.setenv("MLFLOW_ASYNC_LOGGING_THREADPOOL_SIZE", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    mlflow.set_tracking_uri(live_server.url)
    yield mlflow
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.config.enable_async_logging(False)
    mlflow.disable_system_metrics_logging()
    import mlflow.tracking.fluent as fluent

    fluent._active_experiment_id = None
    mlflow.set_tracking_uri(None)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `mlflow server` (SQLite backend, one worker) for the module; its URL. It serves
    artifacts through its proxy (`mlflow-artifacts:/…` URIs), as Runcast does."""
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(root / "server.log", "wb"),  # noqa: SIM115
        start_new_session=True,  # its uvicorn workers stop with it, as one process group
    )

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            # uvicorn's graceful shutdown waits for open keep-alive connections, which on a
            # loaded machine outlasted 30 s: the server's data is throwaway, so it is killed.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    import requests

    while True:
        try:
            if requests.get(f"{url}/health", timeout=5).ok:
                break
        except requests.RequestException:  # still starting
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop()
            pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield url
    stop()
