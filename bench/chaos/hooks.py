"""Loaded into the chaos bench's Celery worker only (`celery worker -I bench.chaos.hooks`), never
by Runcast itself. Two things, both read from the environment the bench gives the worker:

* The liveness thresholds of the bench's profile. `STALL_MIN_S` and `STALL_RECONNECT_GRACE_S`
  are constants of the pure estimators (forecasting/estimators/thresholds.py, no settings there),
  so the worker's copy is changed at its start, before the pool forks; unset, the production
  values stay.
* A marker file per task while it runs in a pool process (`<task id>.<pid>.json`, removed when
  the task returns or raises), so the bench can kill -9 the very process that computes a
  forecast, and see from a marker left behind that it died mid-task, and from a second marker
  of the same task id that the task was delivered again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery.signals import task_postrun, task_prerun

from forecasting.estimators import thresholds

STALL_MIN_S = "BENCH_CHAOS_STALL_MIN_S"
RECONNECT_GRACE_S = "BENCH_CHAOS_RECONNECT_GRACE_S"
TASKS_DIR = "BENCH_CHAOS_TASKS_DIR"


def shorten_thresholds(environ: Mapping[str, str] = os.environ) -> None:
    for variable, name in (
        (STALL_MIN_S, "STALL_MIN_S"),
        (RECONNECT_GRACE_S, "STALL_RECONNECT_GRACE_S"),
    ):
        if environ.get(variable):
            setattr(thresholds, name, float(environ[variable]))


def marker(task_id: str, pid: int) -> Path | None:
    folder = os.environ.get(TASKS_DIR)
    return Path(folder) / f"{task_id}.{pid}.json" if folder else None


@task_prerun.connect
def _task_started(task_id: str, task: Any, args: Any = None, **kwargs: Any) -> None:
    path = marker(task_id, os.getpid())
    if path is None:
        return
    body = {"task": task.name, "args": list(args or ()), "pid": os.getpid(), "at": time.time()}
    # Written whole, then renamed: the bench never reads half a marker.
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps(body))
    scratch.rename(path)


@task_postrun.connect
def _task_ended(task_id: str, **kwargs: Any) -> None:
    path = marker(task_id, os.getpid())
    if path is not None:
        path.unlink(missing_ok=True)


shorten_thresholds()
