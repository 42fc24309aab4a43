"""The stock `mlflow` client, unchanged, logging to Runcast's MLflow API and to a real MLflow
tracking server on this machine: the same workload, points per second for each, the ratio.

Both servers run on PostgreSQL with 2 worker processes (Runcast: gunicorn, 2 workers x 4
threads; MLflow: `mlflow server --workers 2`). The client is the `mlflow` package of .venv (the
`mlflow` extra) in this process, pointed at each server in turn:

  * log_batch: STEPS steps x KEYS metrics, 1,000 metrics per `MlflowClient.log_batch` call
    (MLflow's own per-request limit), timed from the first call to the last answer;
  * log_metric: LOG_METRIC_CALLS synchronous `mlflow.log_metric` calls (one request each).

Every point is then counted where each server stored it (Runcast: the run's chunks; MLflow:
its metrics table through `get_metric_history`), so a fast but lossy server cannot win.

    .venv/bin/python bench/mlflow_throughput.py            # 20,000 steps x 5 metrics
    .venv/bin/python bench/mlflow_throughput.py --quick    # 2,000 steps x 5 metrics
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench import throwaway_secret_key
from bench.harness import (
    PG_URL,
    REDIS_URL,
    ROOT,
    VENV_PY,
    drop_db,
    free_port,
    log,
    manage,
    recreate_db,
    start_group,
    stop_group,
    wait_http,
)

WORK = ROOT / "var" / "bench-mlflow"
# This benchmark's own databases and Redis index, apart from bench/ingest.py's and the tests'.
RUNCAST_DB, MLFLOW_DB = "runcast_mlflow_bench", "runcast_mlflow_bench_src"
REDIS_DB = int(os.environ.get("BENCH_MLFLOW_REDIS_DB", "2"))
KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "val_loss")
LOG_METRIC_CALLS = 500

SETUP_CODE = """
from tracker.models import Project
from tracker import services
project = Project.objects.create(slug="bench", name="Bench")
print(services.token_create(project=project, name="bench", scope="write"))
"""
COUNT_CODE = """
import json
from django.db.models import Sum
from tracker.models import MetricChunk, Run
print(json.dumps({r.public_id: MetricChunk.objects.filter(run=r).aggregate(n=Sum("n"))["n"] or 0
                  for r in Run.objects.all()}))
"""


def workload(mlflow: Any, url: str, steps: int) -> dict[str, Any]:
    """Run both loops against `url` (env already carries the token); return timings."""
    from mlflow.entities import Metric

    mlflow.set_tracking_uri(url)
    client = mlflow.MlflowClient()
    mlflow.set_experiment("bench")
    with mlflow.start_run(run_name="warm-up") as warm:  # first requests load server code
        client.log_batch(warm.info.run_id, metrics=[Metric("loss", 1.0, 0, 0)])
    run = mlflow.start_run(run_name="log-batch")
    t0 = int(time.time() * 1000)
    pending: list[Any] = []
    started = time.perf_counter()
    for step in range(steps):
        for i, key in enumerate(KEYS):
            pending.append(Metric(key, 1.0 / (step + 1) + i, t0 + step, step))
        if len(pending) >= 1000:
            client.log_batch(run.info.run_id, metrics=pending[:1000])
            pending = pending[1000:]
    if pending:
        client.log_batch(run.info.run_id, metrics=pending)
    batch_s = time.perf_counter() - started
    mlflow.end_run()
    with mlflow.start_run(run_name="log-metric") as single:
        started = time.perf_counter()
        for step in range(LOG_METRIC_CALLS):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        metric_s = time.perf_counter() - started
    stored = {
        "log_batch": sum(len(client.get_metric_history(run.info.run_id, k)) for k in KEYS),
        "log_metric": len(client.get_metric_history(single.info.run_id, "loss")),
    }
    return {
        "batch_points": steps * len(KEYS),
        "batch_s": batch_s,
        "batch_points_per_s": steps * len(KEYS) / batch_s,
        "log_metric_ms": 1000 * metric_s / LOG_METRIC_CALLS,
        "stored_via_api": stored,
        "run_ids": [run.info.run_id, single.info.run_id],
    }


def runcast(mlflow: Any, steps: int) -> dict[str, Any]:
    env = dict(
        os.environ,
        DATABASE_URL=f"{PG_URL}/{RUNCAST_DB}",
        DJANGO_SETTINGS_MODULE="config.settings.base",
        SECRET_KEY=throwaway_secret_key(),
        CELERY_BROKER_URL=f"{REDIS_URL}/{REDIS_DB}",
        CACHE_URL=f"{REDIS_URL}/{REDIS_DB}",
        LOG_LEVEL="WARNING",
    )
    recreate_db(RUNCAST_DB)
    log("runcast: migrating a fresh database")
    manage(env, "migrate", "--noinput")
    token = manage(env, "shell", "-c", SETUP_CODE).strip().splitlines()[-1]
    port, logfile = free_port(), WORK / "gunicorn.log"
    server = start_group(
        [
            str(VENV_PY.parent / "gunicorn"),
            "config.wsgi",
            "--workers",
            "2",
            "--threads",
            "4",
            "--bind",
            f"127.0.0.1:{port}",
        ],
        env,
        logfile,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", server, logfile, timeout=60)
        os.environ["MLFLOW_TRACKING_TOKEN"] = token
        log("runcast: the workload through its MLflow API")
        result = workload(mlflow, url, steps)
        counts = json.loads(manage(env, "shell", "-c", COUNT_CODE).strip().splitlines()[-1])
        result["stored_in_db"] = [counts.get(r) for r in result.pop("run_ids")]
        return result
    finally:
        os.environ.pop("MLFLOW_TRACKING_TOKEN", None)
        stop_group(server)
        drop_db(RUNCAST_DB)


@contextmanager
def mlflow_server_on(db: str) -> Iterator[str]:
    """A real `mlflow server` (2 workers) on a fresh PostgreSQL database `db`; yields its URL.
    The database is dropped on exit."""
    WORK.mkdir(parents=True, exist_ok=True)
    recreate_db(db)
    port, logfile = free_port(), WORK / "mlflow-server.log"
    server = start_group(
        [
            str(VENV_PY.parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"{PG_URL.replace('postgres://', 'postgresql+psycopg2://')}/{db}",
            "--default-artifact-root",
            (WORK / "artifacts").as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "2",
        ],
        dict(os.environ),
        logfile,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", server, logfile, timeout=180)
        yield url
    finally:
        stop_group(server)
        drop_db(db)


def mlflow_server(mlflow: Any, steps: int) -> dict[str, Any]:
    with mlflow_server_on(MLFLOW_DB) as url:
        log("mlflow: the same workload against `mlflow server`")
        result = workload(mlflow, url, steps)
        result.pop("run_ids")
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 steps instead of 20,000")
    args = parser.parse_args()
    steps = 2_000 if args.quick else 20_000
    WORK.mkdir(parents=True, exist_ok=True)
    for name in [k for k in os.environ if k.startswith("MLFLOW_")]:
        del os.environ[name]
    import mlflow

    rc = runcast(mlflow, steps)
    ml = mlflow_server(mlflow, steps)
    print(
        f"workload: {steps:,} steps x {len(KEYS)} metrics via log_batch; "
        f"{LOG_METRIC_CALLS} synchronous log_metric calls; mlflow {mlflow.__version__}"
    )
    for name, r in (("runcast (MLflow API)", rc), ("mlflow server", ml)):
        print(
            f"{name:22} log_batch {r['batch_points_per_s']:>9,.0f} points/s "
            f"({r['batch_s']:.1f} s)   log_metric {r['log_metric_ms']:6.1f} ms/call   "
            f"stored {r['stored_via_api']}"
        )
    print(
        "ratio runcast/mlflow: log_batch "
        f"{rc['batch_points_per_s'] / ml['batch_points_per_s']:.2f}x, "
        f"log_metric latency {rc['log_metric_ms'] / ml['log_metric_ms']:.2f}x"
    )
    exact = rc["stored_in_db"] == [steps * len(KEYS), LOG_METRIC_CALLS]
    print(json.dumps({"runcast": rc, "mlflow": ml, "runcast_exact": exact}))
    if not exact:
        raise SystemExit(f"runcast stored {rc['stored_in_db']}, expected exactly every point")


if __name__ == "__main__":
    main()
