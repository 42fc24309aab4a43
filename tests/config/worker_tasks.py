"""Tasks a test's real worker loads (`celery worker -I tests.config.worker_tasks`): no database,
only files, so the test sees what ran without sharing anything else with the worker."""

from __future__ import annotations

import time
from pathlib import Path

from config.celery import app


@app.task(name="tests.outage.hold")
def hold(*, started: str, release: str, timeout_s: float) -> None:
    """Runs until `release` exists (at most `timeout_s`). With acks_late, its message stays
    unacknowledged meanwhile, while the worker's other process leaves the consumer polling
    Redis for more: the state in which a Redis outage killed the worker (issue 24)."""
    Path(started).write_text("started")
    deadline = time.monotonic() + timeout_s
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@app.task(name="tests.outage.touch")
def touch(*, path: str) -> None:
    Path(path).write_text("ran")
