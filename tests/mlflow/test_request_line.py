"""gunicorn, as Runcast starts it, takes MLflow's largest legal request line: 100 run ids in one
get-history-bulk-interval (issue 26: 90 was the most that worked)."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_request_line_of_100_run_ids_reaches_the_api() -> None:
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "config.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        query = "&".join(f"run_ids={uuid.uuid4().hex}" for _ in range(100))
        path = f"/api/2.0/mlflow/metrics/get-history-bulk-interval?{query}&metric_key=loss"
        assert len(path) > 4094  # gunicorn's default limit
        deadline = time.monotonic() + 30
        while True:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                connection.request("GET", path)
                answer = connection.getresponse()
                break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.2)
        # Django's MLflow API answered (no token: 401 in MLflow's JSON), not gunicorn's HTML 400.
        assert answer.status == 401
        assert answer.getheader("Content-Type") == "application/json"
        connection.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
